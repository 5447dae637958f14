"""The spend ledger's rules as plain code (SpendBook): one create per job whatever runs come and
go, takeovers only before a create began, budgets per UTC day and month, and the totals."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Literal

import pytest
from pydantic import ValidationError

from spillway.core.ledger import (
    Authorisation,
    BeginCreate,
    BudgetOrder,
    Budgets,
    LedgerInput,
    ReserveRequest,
    SettleRequest,
    Vetted,
)
from spillway.core.spend_book import (
    APPROVAL_REFUSED,
    BUDGET_ORDER_REFUSED,
    SpendBook,
    SpendRefused,
    recorded_create,
    token_of,
)
from tests.support.constants import CLIP_USD

SettleState = Literal["charged", "maybe_charged", "released", "refused"]
NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
ANY = Vetted()  # what the ledger read for a begin or settle of an entry written before 0.4.0


def ask(
    job: str = "job-1",
    run: str = "run-a",
    cost: float | None = CLIP_USD,
    authorisation: Authorisation = "armed",
    incarnation: str | None = None,
) -> tuple[ReserveRequest, Vetted]:
    """A reservation and what the ledger read for it (its cost, the incarnation)."""
    request = ReserveRequest(
        job_id=job,
        run_id=run,
        provider="minimax",
        authorised_by="armed" if authorisation == "armed" else "bär",
        authorisation=authorisation,
    )
    return request, Vetted(cost_usd=cost, incarnation=incarnation)


def settle(
    state: SettleState, run: str = "run-a", task: str | None = None
) -> tuple[SettleRequest, Vetted]:
    return SettleRequest(job_id="job-1", run_id=run, state=state, task_id=task), ANY


def refused(kind: str, call) -> SpendRefused:
    with pytest.raises(SpendRefused) as raised:
        call()
    assert raised.value.kind == kind, raised.value.message
    return raised.value


def test_a_retried_reservation_of_the_same_run_gets_its_own_entry_back():
    book = SpendBook([], Budgets())
    first = book.reserve(*ask(), NOW)
    again = book.reserve(*ask(), NOW + timedelta(seconds=1))
    assert again is first and len(book.entries) == 1


def test_a_job_whose_create_was_sent_gets_no_second_reservation_from_any_run():
    book = SpendBook([], Budgets())
    book.reserve(*ask(), NOW)
    book.begin(BeginCreate(job_id="job-1", run_id="run-a"), ANY, NOW)
    for run in ("run-a", "run-b"):
        error = refused("exists", lambda r=run: book.reserve(*ask(run=r), NOW))
        assert error.entry is not None and error.entry.sent_at == NOW
    book.settle(*settle("charged", task="task-1"), NOW)
    error = refused("exists", lambda: book.reserve(*ask(run="run-after-reset"), NOW))
    assert error.entry is not None and error.entry.task_id == "task-1"
    assert "task task-1" in error.message


def test_an_unsent_reservation_is_taken_over_and_the_old_run_can_no_longer_begin():
    book = SpendBook([], Budgets())
    book.reserve(*ask(run="run-a"), NOW)
    taken = book.reserve(*ask(run="run-b"), NOW)  # a reset after the reservation
    assert taken.run_id == "run-b"
    book.begin(BeginCreate(job_id="job-1", run_id="run-b"), ANY, NOW)
    refused("exists", lambda: book.begin(BeginCreate(job_id="job-1", run_id="run-a"), ANY, NOW))
    assert book.totals("day", NOW).reserved_usd == CLIP_USD  # counted once


def test_a_create_begins_only_once():
    book = SpendBook([], Budgets())
    book.reserve(*ask(), NOW)
    book.begin(BeginCreate(job_id="job-1", run_id="run-a"), ANY, NOW)
    refused("exists", lambda: book.begin(BeginCreate(job_id="job-1", run_id="run-a"), ANY, NOW))


def test_a_reset_run_replaying_an_old_reservation_takes_it_over_at_begin():
    book = SpendBook([], Budgets())
    book.reserve(*ask(run="run-a"), NOW)
    entry = book.begin(BeginCreate(job_id="job-1", run_id="run-b"), ANY, NOW)
    assert entry.run_id == "run-b" and entry.sent_at == NOW


def test_nothing_begins_without_a_reservation():
    book = SpendBook([], Budgets())
    refused("no_reservation", lambda: book.begin(BeginCreate(job_id="job-1", run_id="r"), ANY, NOW))


def test_a_provable_refusal_frees_the_next_provider_but_a_begun_create_is_never_released():
    book = SpendBook([], Budgets(daily_usd=CLIP_USD))
    book.reserve(*ask(), NOW)
    book.begin(BeginCreate(job_id="job-1", run_id="run-a"), ANY, NOW)
    # "released" would say nothing was sent: only a create that never began may say so.
    refused("settled", lambda: book.settle(*settle("released"), NOW))
    assert book.settle(*settle("refused"), NOW).state == "refused"
    assert book.totals("day", NOW).remaining_usd == CLIP_USD
    again = book.reserve(*ask(run="run-a"), NOW)
    assert again.state == "reserved" and len(book.entries) == 2


def test_a_job_id_used_again_is_a_new_job_with_no_old_task():
    book = SpendBook([], Budgets())
    book.reserve(*ask(incarnation="first"), NOW)
    book.begin(BeginCreate(job_id="job-1", run_id="run-a"), Vetted(incarnation="first"), NOW)
    charged = SettleRequest(job_id="job-1", run_id="run-a", state="charged", task_id="old")
    book.settle(charged, Vetted(incarnation="first"), NOW)
    assert recorded_create(book.entries, "job-1", "second") is None
    entry = book.reserve(*ask(run="run-z", incarnation="second"), NOW)
    assert (entry.state, entry.incarnation) == ("reserved", "second")
    found = recorded_create(book.entries, "job-1", "first")
    assert found is not None and found.task_id == "old"  # a reset of the first still follows it


def test_an_ask_under_another_authorisation_is_judged_anew():
    """A reservation the job never asked for in this form (sent for its run by someone else, or
    an earlier armed ask) is not handed back to an approval: it is taken over and checked."""
    book = SpendBook([], Budgets(daily_usd=CLIP_USD))
    book.reserve(*ask(authorisation="armed"), NOW)
    book.budgets = Budgets(daily_usd=0.01)
    error = refused("budget", lambda: book.reserve(*ask(authorisation="approved"), NOW))
    assert error.shortfall is not None


def test_an_unsent_reservation_settled_as_maybe_charged_is_released_instead():
    book = SpendBook([], Budgets())
    book.reserve(*ask(), NOW)
    entry = book.settle(*settle("maybe_charged", run="run-b"), NOW)
    assert entry.state == "released" and "never began" in entry.note


def test_a_job_that_says_maybe_over_a_freed_entry_hears_the_entry_as_it_is():
    """The job's settle after a lost create, retried once its worker died after the ledger
    released the unsent reservation, or sent after the attempt recorded the provider's "no":
    the job is told what the ledger knows, never "no entry" (it would then say a charge may
    exist that the ledger never counts)."""
    book = SpendBook([], Budgets())
    book.reserve(*ask(), NOW)
    assert book.settle(*settle("maybe_charged", run="run-a"), NOW).state == "released"
    again = book.settle(*settle("maybe_charged", run="run-a"), NOW)
    assert again.state == "released" and "never began" in again.note
    assert book.totals("day", NOW).spent_usd == 0

    other = SpendBook([], Budgets())
    other.reserve(*ask(), NOW)
    begun_with("the attempt's own", other)
    no = SettleRequest(job_id="job-1", run_id="run-a", state="refused", nonce="the attempt's own")
    other.settle(no, ANY, NOW)
    assert other.settle(*settle("maybe_charged"), NOW).state == "refused"
    assert other.totals("day", NOW).spent_usd == 0


def test_a_job_whose_freed_entry_left_at_a_continue_as_new_hears_none_began():
    book = SpendBook([], Budgets())
    book.reserve(*ask(incarnation="i-1"), NOW)
    book.settle(SettleRequest(job_id="job-1", run_id="run-a", state="released"), ANY, NOW)
    again = SpendBook.of(book.carried(NOW, 2000))
    maybe = SettleRequest(job_id="job-1", run_id="run-a", state="maybe_charged")
    error = refused("no_reservation", lambda: again.settle(maybe, Vetted(incarnation="i-1"), NOW))
    assert error.entry is not None and error.entry.state == "released"
    # A create that went out leaves its tag: nobody is told that none began.
    charged = SpendBook([], Budgets())
    charged.reserve(*ask(incarnation="i-1"), NOW)
    charged.begin(BeginCreate(job_id="job-1", run_id="run-a"), Vetted(incarnation="i-1"), NOW)
    done = SettleRequest(job_id="job-1", run_id="run-a", state="charged", task_id="t-1")
    charged.settle(done, Vetted(incarnation="i-1"), NOW)
    later = SpendBook.of(charged.carried(NOW, 2000))
    error = refused("no_reservation", lambda: later.settle(maybe, Vetted(incarnation="i-1"), NOW))
    assert error.entry is None


def test_an_ambiguous_create_counts_as_spent_and_may_learn_its_task_later():
    book = SpendBook([], Budgets())
    book.reserve(*ask(), NOW)
    book.begin(BeginCreate(job_id="job-1", run_id="run-a"), ANY, NOW)
    book.settle(*settle("maybe_charged", run="run-b"), NOW)  # a later run records it
    assert book.totals("day", NOW).spent_usd == CLIP_USD
    assert book.settle(*settle("charged", task="task-9"), NOW).task_id == "task-9"
    refused("settled", lambda: book.settle(*settle("released"), NOW))


def test_a_charged_entry_is_final_and_a_repeated_settle_is_a_no_op():
    book = SpendBook([], Budgets())
    book.reserve(*ask(), NOW)
    book.begin(BeginCreate(job_id="job-1", run_id="run-a"), ANY, NOW)
    book.settle(*settle("charged", task="task-1"), NOW)
    assert book.settle(*settle("charged", task="task-1"), NOW).task_id == "task-1"
    refused("settled", lambda: book.settle(*settle("maybe_charged"), NOW))
    refused("settled", lambda: book.settle(*settle("released"), NOW))


@pytest.mark.parametrize(
    ("daily", "monthly", "period"), [(1.0, None, "day"), (None, 1.0, "month"), (5.0, 1.0, "month")]
)
def test_armed_spending_stops_where_the_budget_would_be_exceeded(daily, monthly, period):
    book = SpendBook([], Budgets(daily_usd=daily, monthly_usd=monthly))
    granted = 0
    for n in range(10):
        try:
            book.reserve(*ask(job=f"job-{n}"), NOW)
            granted += 1
        except SpendRefused as error:
            assert error.kind == "budget" and error.shortfall is not None
            assert error.shortfall.period == period
            assert error.shortfall.remaining_usd == pytest.approx(1.0 - 3 * CLIP_USD)
    assert granted == 3  # 3 x 0.28 = 0.84 <= 1.00 < 4 x 0.28


def test_a_budget_spent_to_the_cent_has_nothing_left_never_minus_nothing():
    book = SpendBook([], Budgets(daily_usd=0.84))
    for n in range(3):  # 0.28 + 0.28 + 0.28 is a hair over 0.84 in floating point
        book.reserve(*ask(job=f"job-{n}"), NOW)
    left = book.totals("day", NOW).remaining_usd
    assert left == 0.0 and math.copysign(1.0, left) == 1.0
    error = refused("budget", lambda: book.reserve(*ask(job="job-3"), NOW))
    assert error.shortfall is not None
    assert "has $0.00 left" in str(error), str(error)


def test_a_plain_approval_respects_the_budget_and_over_budget_goes_past_it():
    book = SpendBook([], Budgets(daily_usd=0.3))
    book.reserve(*ask(job="job-0"), NOW)
    refused("budget", lambda: book.reserve(*ask(authorisation="approved"), NOW))
    entry = book.reserve(*ask(authorisation="approved_over_budget"), NOW)
    assert entry.authorisation == "approved_over_budget"
    assert book.totals("day", NOW).remaining_usd == pytest.approx(0.3 - 2 * CLIP_USD)


def test_an_unknown_estimate_is_refused_when_a_budget_is_set():
    book = SpendBook([], Budgets(daily_usd=10))
    error = refused("budget", lambda: book.reserve(*ask(cost=None), NOW))
    assert error.shortfall is not None and error.shortfall.estimate_usd is None
    book.budgets = Budgets()
    assert book.reserve(*ask(cost=None), NOW).cost_usd is None  # no budget: no limit


def test_days_and_months_are_utc_and_a_new_day_has_its_budget_back():
    book = SpendBook([], Budgets(daily_usd=CLIP_USD, monthly_usd=3 * CLIP_USD))
    book.reserve(*ask(job="a"), NOW)
    book.begin(BeginCreate(job_id="a", run_id="run-a"), ANY, NOW)  # sent: it keeps counting
    refused("budget", lambda: book.reserve(*ask(job="b"), NOW))
    tomorrow = NOW + timedelta(days=1)
    book.reserve(*ask(job="b"), tomorrow)
    assert book.totals("day", tomorrow).reserved_usd == CLIP_USD
    assert book.totals("month", tomorrow).reserved_usd == pytest.approx(2 * CLIP_USD)
    next_month = datetime(2027, 1, 1, 0, 0, tzinfo=UTC)
    assert book.totals("month", next_month).reserved_usd == 0


def test_an_unsent_reservation_expires_and_stops_counting():
    book = SpendBook([], Budgets(daily_usd=CLIP_USD))
    book.reserve(*ask(), NOW)
    later = NOW + timedelta(hours=2)
    assert book.totals("day", later).reserved_usd == 0
    refused(
        "no_reservation",
        lambda: book.begin(BeginCreate(job_id="job-1", run_id="run-a"), ANY, later),
    )
    assert book.reserve(*ask(), later).at == later


def test_a_continued_ledger_carries_open_entries_totals_and_tags_never_settled_entries():
    book = SpendBook([], Budgets(daily_usd=1.0, monthly_usd=10.0))
    old = NOW - timedelta(days=100)
    for job, at in (("old", old), ("new", NOW)):
        book.reserve(*ask(job=job, incarnation=f"i-{job}"), at)
        book.begin(BeginCreate(job_id=job, run_id="run-a"), Vetted(incarnation=f"i-{job}"), at)
        charged = SettleRequest(job_id=job, run_id="run-a", state="charged", task_id=f"t-{job}")
        book.settle(charged, Vetted(incarnation=f"i-{job}"), at)
    book.reserve(*ask(job="open", incarnation="i-open"), NOW)
    day, month = book.totals("day", NOW), book.totals("month", NOW)

    carried = book.carried(NOW, 2000)
    again = SpendBook.of(carried)

    assert [e.job_id for e in carried.entries] == ["open"]
    assert again.totals("day", NOW) == day and again.totals("month", NOW) == month
    assert carried.spent == {"2026-12-01": CLIP_USD, "2026-12": CLIP_USD, "2026-08": CLIP_USD}
    assert list(carried.created) == ["2026-12"]  # older than KEEP: the vet reads earlier runs
    # The settled create is no longer held, and still never reserved again for its incarnation.
    error = refused("exists", lambda: again.reserve(*ask(job="new", incarnation="i-new"), NOW))
    assert "last continued as new" in error.message
    assert again.reserve(*ask(job="new", run="run-z", incarnation="i-reused"), NOW).state == (
        "reserved"
    )


def test_a_reset_run_whose_earlier_run_the_vet_found_creating_is_refused_without_a_tag():
    book = SpendBook([], Budgets())
    request, terms = ask(incarnation="i-1")
    error = refused(
        "exists",
        lambda: book.reserve(request, terms.model_copy(update={"created_earlier": True}), NOW),
    )
    assert "an earlier run of job job-1 ordered or followed a cloud task" in error.message
    assert book.entries == []


def test_a_reset_run_finds_the_create_an_earlier_run_sent_and_nothing_else():
    """What a job asks before it puts the cloud to a person: a create already out (a reset job's)
    is followed; a reservation whose create never left, or a released one, is not a create."""
    book = SpendBook([], Budgets())
    book.reserve(*ask(), NOW)
    assert recorded_create(book.entries, "job-1", None) is None  # reserved, never sent
    book.begin(BeginCreate(job_id="job-1", run_id="run-a"), ANY, NOW)
    assert recorded_create(book.entries, "job-1", None) is not None  # sent, answer unknown yet
    book.settle(*settle("charged", task="task-7"), NOW)
    found = recorded_create(book.entries, "job-1", None)
    assert found is not None and (found.state, found.task_id) == ("charged", "task-7")
    assert recorded_create(book.entries, "job-2", None) is None

    released = SpendBook([], Budgets())
    released.reserve(*ask(), NOW)
    released.settle(*settle("released"), NOW)
    assert recorded_create(released.entries, "job-1", None) is None


def test_a_task_id_turns_a_refused_entry_charged_a_refusal_never_unchanges_a_charge():
    book = SpendBook([], Budgets())
    book.reserve(*ask(), NOW)
    book.begin(BeginCreate(job_id="job-1", run_id="run-a"), ANY, NOW)
    book.settle(*settle("refused"), NOW)
    assert book.settle(*settle("charged", task="task-3"), NOW).state == "charged"
    assert book.totals("day", NOW).spent_usd == CLIP_USD
    refused("settled", lambda: book.settle(*settle("refused"), NOW))


@pytest.mark.parametrize("cost", [-1e9, float("nan"), float("inf"), -0.01])
def test_a_cost_that_is_negative_or_not_finite_is_refused_before_the_ledger_sees_it(cost):
    with pytest.raises(ValidationError, match="cost_usd"):
        SettleRequest(job_id="j", run_id="r", state="maybe_charged", cost_usd=cost)
    with pytest.raises(ValidationError, match="spent"):
        LedgerInput.model_validate({"spent": {"2026-12": cost}})


def test_a_ledger_input_that_would_never_continue_is_refused():
    with pytest.raises(ValidationError, match="updates_per_run"):
        LedgerInput(updates_per_run=0)


def approved_with(
    signature: str, job: str = "job-1", run: str = "run-a", incarnation: str = "i1"
) -> tuple[ReserveRequest, Vetted]:
    """A reservation under a signed approval the vet found in the job's history."""
    request, terms = ask(job=job, run=run, authorisation="approved", incarnation=incarnation)
    until = NOW + timedelta(minutes=15)
    return request, terms.model_copy(update={"approval": signature, "approval_until": until})


def test_a_signed_approval_pays_for_one_create_and_is_remembered_until_it_expires():
    book = SpendBook([], Budgets())
    entry = book.reserve(*approved_with("sig-1"), NOW)
    assert book.reserve(*approved_with("sig-1"), NOW) is entry  # the same run asking again
    book.begin(BeginCreate(job_id="job-1", run_id="run-a"), ANY, NOW)
    book.settle(*settle("charged", task="task-1"), NOW)
    # However the request comes (another job, another incarnation), the signature paid already.
    other = approved_with("sig-1", "job-2", incarnation="i2")
    error = refused(APPROVAL_REFUSED, lambda: book.reserve(*other, NOW))
    assert "each signature pays for one" in error.message

    carried = book.carried(NOW + timedelta(minutes=1), 100)
    assert list(carried.approvals) == ["sig-1"] and carried.entries == []
    continued = SpendBook.of(carried)
    later = NOW + timedelta(minutes=2)
    refused(APPROVAL_REFUSED, lambda: continued.reserve(*other, later))
    # Past its expiry the signature cannot be sent again at all: it is carried no longer.
    assert continued.carried(NOW + timedelta(minutes=16), 100).approvals == {}


def test_a_signed_approval_whose_create_never_went_out_is_not_spent():
    book = SpendBook([], Budgets())
    book.reserve(*approved_with("sig-1"), NOW)
    book.settle(*settle("released"), NOW)  # the create never began: nothing was sent
    again = book.reserve(*approved_with("sig-1", run="run-b"), NOW)
    assert again.state == "reserved" and again.approval == "sig-1"
    assert book.carried(NOW, 100).approvals == {}


def begun_with(nonce: str, book: SpendBook, attempt: str = "run-a/1/1") -> None:
    begin = BeginCreate(job_id="job-1", run_id="run-a", attempt=attempt, token=token_of(nonce))
    book.begin(begin, ANY, NOW)


def test_a_begun_entry_is_freed_or_repriced_only_with_the_nonce_of_the_attempt_that_began():
    book = SpendBook([], Budgets(daily_usd=1.0))
    book.reserve(*ask(), NOW)
    begun_with("the attempt's own", book)
    forged = SettleRequest(job_id="job-1", run_id="run-a", state="refused")
    refused("token", lambda: book.settle(forged, ANY, NOW))
    cheaper = SettleRequest(job_id="job-1", run_id="run-a", state="maybe_charged", cost_usd=0)
    refused("token", lambda: book.settle(cheaper, ANY, NOW))
    wrong = forged.model_copy(update={"nonce": "a guess"})
    refused("token", lambda: book.settle(wrong, ANY, NOW))
    # Saying more is spent needs no nonce: a task id that may be false, a charge that may exist.
    book.settle(*settle("charged", task="someone's-task"), NOW)
    assert book.totals("day", NOW).spent_usd == CLIP_USD
    # The attempt's own word wins: its task, or the provider's provable "no".
    real = SettleRequest(
        job_id="job-1", run_id="run-a", state="charged", task_id="task-1", nonce="the attempt's own"
    )
    entry = book.settle(real, ANY, NOW)
    assert (entry.state, entry.task_id, entry.cost_usd) == ("charged", "task-1", CLIP_USD)
    assert book.settle(real, ANY, NOW) is entry  # retried: nothing changes
    # Used once, the nonce is in the ledger's history: it frees nothing afterwards.
    no = real.model_copy(update={"state": "refused", "task_id": None})
    refused("token", lambda: book.settle(no, ANY, NOW))
    assert book.totals("day", NOW).spent_usd == CLIP_USD


def test_the_attempts_provable_refusal_frees_its_entry_once_whatever_was_said_before():
    book = SpendBook([], Budgets(daily_usd=1.0))
    book.reserve(*ask(), NOW)
    begun_with("the attempt's own", book)
    book.settle(*settle("maybe_charged"), NOW)  # anyone may say a charge may exist
    no = SettleRequest(job_id="job-1", run_id="run-a", state="refused", nonce="the attempt's own")
    assert book.settle(no, ANY, NOW).state == "refused"
    assert book.settle(no, ANY, NOW).state == "refused"  # retried: a no-op
    assert book.totals("day", NOW).spent_usd == 0
    again = SettleRequest(
        job_id="job-1", run_id="run-a", state="charged", task_id="t", nonce="the attempt's own"
    )
    refused("token", lambda: book.settle(again, ANY, NOW))


def test_the_same_attempt_beginning_again_with_another_token_is_refused():
    book = SpendBook([], Budgets())
    book.reserve(*ask(), NOW)
    begun_with("mine", book)
    begun_with("mine", book)  # its first answer was lost: it asks again
    error = refused("exists", lambda: begun_with("read off Temporal", book))
    assert "with another token" in error.message


def test_a_create_s_time_to_done_is_learnt_once_and_carried_and_an_old_input_reads_as_before():
    book = SpendBook([], Budgets())
    for n, took in enumerate((40.0, 60.0, 3600.0)):
        job = f"job-{n}"
        book.reserve(*ask(job=job), NOW)
        book.begin(BeginCreate(job_id=job, run_id="run-a"), ANY, NOW)
        charged = SettleRequest(job_id=job, run_id="run-a", state="charged", task_id=f"t-{n}")
        book.settle(charged, ANY, NOW)
        done = charged.model_copy(update={"done_s": took})
        entry = book.settle(done, ANY, NOW + timedelta(seconds=took))
        assert entry.done_s == took and entry.settled_at == NOW  # settled when charged
        book.settle(done.model_copy(update={"done_s": 1.0}), ANY, NOW)  # retried: learnt once
    # The median: one task stuck for an hour does not make every estimate an hour.
    assert book.eta_s("minimax") == 60.0 and book.eta_s("kling") is None
    carried = book.carried(NOW, 2000)
    assert SpendBook.of(carried).eta_s("minimax") == 60.0
    # What a ledger's input was before these times: its JSON, so a seal made then still checks.
    before = LedgerInput(entries=[e.model_copy(update={"done_s": None}) for e in book.entries])
    assert "done_s" not in before.model_dump_json()


# --- the budget is the book's own -------------------------------------------------------------


def order(daily: float | None, at: datetime, by: str = "ana", seed: bool = False) -> BudgetOrder:
    """An order as the vet passes it on (its signature checked there)."""
    return BudgetOrder(budgets=Budgets(daily_usd=daily), by=by, issued_at=at, seed=seed)


def test_a_workers_settings_change_no_budget_of_the_book():
    book = SpendBook([], Budgets(daily_usd=CLIP_USD))
    request, terms = ask()
    book.reserve(request, terms.model_copy(update={"budgets": Budgets()}), NOW)
    assert book.budgets == Budgets(daily_usd=CLIP_USD)
    refused("budget", lambda: book.reserve(*ask(job="job-2"), NOW))


def test_an_order_sets_the_budget_and_says_who_and_when():
    book = SpendBook([], Budgets())
    assert not book.budget_is_set()
    issued = NOW - timedelta(seconds=5)
    assert book.set_budgets(order(0.28, issued), NOW) == Budgets(daily_usd=0.28)
    assert book.budget_set is not None
    assert (book.budget_set.by, book.budget_set.issued_at, book.budget_set.at) == (
        "ana",
        issued,
        NOW,
    )
    summary = book.summary(NOW)
    assert summary.day.budget_usd == 0.28 and summary.budget_set == book.budget_set
    carried = SpendBook.of(book.carried(NOW, 2000))
    assert carried.budgets == book.budgets and carried.budget_set == book.budget_set


def test_an_order_not_newer_than_the_one_in_force_changes_nothing():
    book = SpendBook([], Budgets())
    book.set_budgets(order(0.28, NOW), NOW)
    for at in (NOW, NOW - timedelta(minutes=1)):  # the same order sent again, an older one
        error = refused(
            BUDGET_ORDER_REFUSED, lambda a=at: book.set_budgets(order(99.0, a, by="eve"), NOW)
        )
        assert "not newer" in error.message
    assert book.budgets == Budgets(daily_usd=0.28) and book.budget_set is not None
    assert book.budget_set.by == "ana"
    cleared = book.set_budgets(order(None, NOW + timedelta(seconds=1), by="ben"), NOW)
    assert cleared == Budgets() and book.budget_is_set()  # cleared on purpose is set


def test_a_workers_seed_is_taken_once_and_only_by_a_book_never_set():
    book = SpendBook([], Budgets())
    assert book.set_budgets(order(0.28, NOW, by="worker a", seed=True), NOW).daily_usd == 0.28
    assert book.budget_set is not None and book.budget_set.seed
    later = NOW + timedelta(minutes=1)
    assert book.set_budgets(order(5.0, later, by="worker b", seed=True), later).daily_usd == 0.28
    assert book.set_budgets(order(1.0, later, by="ana"), later).daily_usd == 1.0  # a person's
    after = later + timedelta(minutes=1)
    assert book.set_budgets(order(9.0, after, by="worker c", seed=True), after).daily_usd == 1.0


def test_a_ledger_carried_with_a_budget_from_before_counts_as_set():
    legacy = SpendBook.of(LedgerInput(budgets=Budgets(daily_usd=0.28)))
    assert legacy.budget_is_set() and legacy.budget_set is None
    legacy.set_budgets(order(5.0, NOW, by="worker", seed=True), NOW)
    assert legacy.budgets == Budgets(daily_usd=0.28)
    assert legacy.set_budgets(order(1.0, NOW), NOW) == Budgets(daily_usd=1.0)
    # Never set, it stays unset in what it carries: no key appears in a sealed input.
    assert "budget_set" not in SpendBook([], Budgets()).carried(NOW, 2000).model_dump()
