"""The seal on a spend ledger's input (spillway/core/ledger_seal.py): made with the workers' secret
for one ledger id, over the whole input, and fresh only just before the run it starts; budget
orders signed with the same secret; a vet without it deciding nothing; and `spillway health`'s
word on workers that do not seal, or whose budget settings are not the ledger's."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from temporalio.testing import ActivityEnvironment

from activities.policy import PolicyActivities, PolicyRequest
from activities.spend.vet import LedgerVetting, VetBatch, VetRequest
from spillway.cli.health import (
    BUDGET_IS_THE_LEDGERS,
    UNSEALED,
    BudgetHealth,
    WorkersHealth,
    budget_settings_health,
    ledger_seal_health,
)
from spillway.core.ledger import Budgets, LedgerInput
from spillway.core.ledger_seal import (
    SEAL_FRESH,
    sealed,
    signed_order,
    why_not_sealed,
    why_not_signed,
)
from spillway.core.models import WorkersView
from spillway.core.tiers import load_tiers
from tests.support.settings import KEY, make_settings

SECRET = "0123456789abcdef0123456789abcdef"
LEDGER = "spillway-spend-ledger-spillway"
NOW = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)


def a_restore() -> LedgerInput:
    return LedgerInput(spent={"2026-12": 12.5, "2026-12-04": 1.4}, created={"2026-12": "ab12"})


def test_a_fresh_seal_of_the_workers_secret_holds_after_a_trip_through_json():
    made = sealed(SECRET, LEDGER, a_restore(), NOW)
    carried = LedgerInput.model_validate_json(made.model_dump_json())  # as the server keeps it
    assert why_not_sealed(SECRET, LEDGER, carried, NOW + timedelta(seconds=2)) is None


@pytest.mark.parametrize(
    "forged",
    [
        {"spent": {"2026-12": 0.0}},  # a month's spending erased
        {"created": {}},  # the created tags dropped
        {"updates_per_run": 1},
        {"sealed_after": "another-run"},  # made to follow another run
    ],
)
def test_an_input_changed_after_sealing_is_not_sealed(forged: dict[str, object]):
    made = sealed(SECRET, LEDGER, a_restore(), NOW).model_copy(update=forged)
    why = why_not_sealed(SECRET, LEDGER, made, NOW)
    assert why is not None and "seal is not the workers'" in why


def test_a_seal_for_another_ledger_or_of_another_secret_is_not_sealed():
    made = sealed(SECRET, LEDGER, a_restore(), NOW)
    assert why_not_sealed(SECRET, "spillway-spend-ledger-other", made, NOW) is not None
    assert why_not_sealed("another secret of 32 characters!", LEDGER, made, NOW) is not None
    assert why_not_sealed(SECRET, LEDGER, a_restore(), NOW) == "its input carries no seal"


def test_a_seal_copied_into_a_later_start_is_stale():
    made = sealed(SECRET, LEDGER, a_restore(), NOW)
    why = why_not_sealed(SECRET, LEDGER, made, NOW + SEAL_FRESH + timedelta(seconds=1))
    assert why is not None and "copied from another start" in why


def test_what_a_continue_as_new_marks_is_not_part_of_the_seal():
    made = sealed(SECRET, LEDGER, a_restore(), NOW)
    assert made.trusted is None
    marked = made.model_copy(update={"trusted": True})
    assert why_not_sealed(SECRET, LEDGER, marked, NOW) is None


@pytest.mark.parametrize(
    ("keys", "secret", "warned"),
    [({}, None, False), (KEY, None, True), (KEY, SECRET, False)],
)
async def test_health_warns_of_workers_whose_ledger_takes_unsealed_input(
    keys: dict[str, str], secret: str | None, warned: bool
):
    """As `spillway health` hears it from the workers' policy: keys and no ledger secret (a
    worker of an earlier release, which started without one)."""
    settings = make_settings(keys, SPILLWAY_LEDGER_SECRET=secret)
    activities = PolicyActivities(settings, load_tiers(settings.SPILLWAY_ROUTING_TIERS))
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, task_queue="spillway")
    policy = await env.run(activities.read_policy, PolicyRequest(job_id="j"))
    budget = BudgetHealth(daily_usd=None, monthly_usd=None)

    ledger_seal_health(budget, WorkersHealth(view=WorkersView(policy=policy, hosts=[])))

    assert (budget.unsealed == UNSEALED) is warned and (budget.unsealed is None) is not warned


def test_a_budget_order_holds_only_signed_for_this_ledger_just_now():
    order = signed_order(SECRET, LEDGER, Budgets(daily_usd=0.28), "ana", NOW)
    assert why_not_signed(SECRET, LEDGER, order, NOW) is None
    changed = order.model_copy(update={"budgets": Budgets(daily_usd=1000)})
    unsigned = order.model_copy(update={"signature": ""})
    stale = NOW + SEAL_FRESH + timedelta(seconds=1)
    whys = {
        "not signed": why_not_signed(SECRET, LEDGER, unsigned, NOW),
        "not the workers'": why_not_signed("another-secret-of-32-characters!", LEDGER, order, NOW),
        "changed": why_not_signed(SECRET, LEDGER, changed, NOW),
        "for the ledger": why_not_signed(SECRET, "another-ledger", order, NOW),
        "not just now": why_not_signed(SECRET, LEDGER, order, stale),
    }
    assert all(
        why is not None and words in why for words, why in whys.items() if words != "changed"
    )
    assert whys["changed"] is not None and "not the workers'" in whys["changed"]


async def test_a_vet_without_the_secret_decides_nothing():
    """A worker that somehow vets without SPILLWAY_LEDGER_SECRET can check no seal and no budget
    order: every answer says nothing was decided (the callers ask again), none grants."""
    settings = make_settings(KEY, SPILLWAY_LEDGER_SECRET=None)
    vetting = LedgerVetting(None, settings, load_tiers(settings.SPILLWAY_ROUTING_TIERS))  # type: ignore[arg-type]
    order = signed_order(SECRET, LEDGER, Budgets(daily_usd=9), "mallory", NOW)
    batch = VetBatch(
        requests=[
            VetRequest(purpose="reserve", job_id="j", run_id="r", provider="minimax"),
            VetRequest(purpose="budget", order=order),
        ]
    )
    answers = await ActivityEnvironment().run(vetting.vet, batch)
    assert [
        a.failed is not None and "SPILLWAY_LEDGER_SECRET" in a.failed for a in answers.answers
    ] == [
        True,
        True,
    ]


@pytest.mark.parametrize(
    ("own", "ledger", "named"),
    [
        ((0.28, None), (0.28, None), False),
        ((None, None), (0.28, None), False),  # no setting: it claims nothing
        ((0.28, None), (1.5, None), True),
        ((None, 10.0), (None, None), True),
    ],
)
async def test_health_names_a_worker_whose_budget_settings_are_not_the_ledgers(
    own: tuple[float | None, float | None], ledger: tuple[float | None, float | None], named: bool
):
    daily, monthly = own
    settings = make_settings(CLOUD_DAILY_BUDGET_USD=daily, CLOUD_MONTHLY_BUDGET_USD=monthly)
    activities = PolicyActivities(settings, load_tiers(settings.SPILLWAY_ROUTING_TIERS))
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, task_queue="spillway")
    policy = await env.run(activities.read_policy, PolicyRequest(job_id="j"))
    budget = BudgetHealth(daily_usd=ledger[0], monthly_usd=ledger[1], read=True)

    budget_settings_health(budget, WorkersHealth(view=WorkersView(policy=policy, hosts=[])))

    assert (budget.worker_settings is not None) is named
    if named:
        assert budget.worker_settings is not None and policy.worker in budget.worker_settings
        assert BUDGET_IS_THE_LEDGERS in budget.worker_settings
        assert (
            "changes nothing: the budget is the ledger's (spillway budget)"
            in budget.worker_settings
        )
