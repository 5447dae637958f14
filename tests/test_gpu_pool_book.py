"""The GPU pool's book (spillway/core/pool_book.py) without a server: places per host, the line in
priority then arrival order, asks and give-backs that belong to an earlier ask changing nothing,
and what people see."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from spillway.core.gpu_pool import (
    HostSeen,
    PoolAnswer,
    PoolAsk,
    PoolDrain,
    PoolHost,
    PoolInput,
    PoolLeave,
    Reading,
)
from spillway.core.hosts import ref
from spillway.core.line_estimate import Waiter, host_places, starts
from spillway.core.models import JobPlace
from spillway.core.pool_book import WARM_PASSES, PoolBook
from spillway.core.pool_holders import LEAVE_CHECKS

T0 = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)
FREE = [HostSeen(name="a40", reachable=True, headroom=True)]
BUSY = [HostSeen(name="a40", reachable=True, headroom=False)]
DOWN = [HostSeen(name="a40", reachable=False, headroom=False)]
SOON, MINUTE = timedelta(seconds=2), timedelta(seconds=60)  # the reprobe; twice the check's period


def book(*hosts: tuple[str, int]) -> PoolBook:
    b = PoolBook(PoolInput())
    b.configure([PoolHost(ref=ref("q", name, n), max_jobs=n) for name, n in hosts or [("a40", 2)]])
    return b


def ask(job: str, s: int = 0, **fields: object) -> PoolAsk:
    return PoolAsk.model_validate(
        {"job_id": job, "asked_at": T0 + timedelta(seconds=s), "seen": FREE} | fields
    )


def answers(sent: list[tuple[str, PoolAnswer]]) -> dict[str, PoolAnswer]:
    return dict(sent)


def test_a_host_is_handed_at_most_max_jobs_and_an_armed_ask_hears_full():
    b = book()
    assert answers(b.ask(ask("j1"), T0))["j1"].host == "a40"
    assert answers(b.ask(ask("j2", 1), T0))["j2"].host == "a40"
    full = answers(b.ask(ask("j3", 2, wait=False), T0))["j3"]
    assert full.host is None and full.position is None
    assert full.full == ["gpu_places_full_a40_2of2"]
    assert b.line == [] and len(b.holders) == 2


def test_the_line_goes_by_priority_then_arrival_and_a_freed_place_goes_to_its_head():
    b = book(("a40", 1))
    b.ask(ask("holder"), T0)
    for job, s, prio in [("p3-a", 1, 3), ("p3-b", 2, 3), ("p3-c", 3, 3), ("p1", 4, 1)]:
        lined = answers(b.ask(ask(job, s, priority=prio), T0))[job]
        assert lined.position is not None
    assert [a.job_id for a in b.line] == ["p1", "p3-a", "p3-b", "p3-c"]
    spot = b.spot("p3-b", T0)
    assert spot is not None and spot.position == 3
    assert b.give_back(PoolLeave(job_id="holder", asked_at=T0), T0 + timedelta(seconds=60))
    sent = answers(b.admit(T0 + timedelta(seconds=60), freshness=timedelta(seconds=2)))
    assert sent == {"p1": PoolAnswer(asked_at=T0 + timedelta(seconds=4), host="a40")}
    # The ETA counts rounds of the places ahead, each as long as the recent holds (60 s).
    spot = b.spot("p3-b", T0 + timedelta(seconds=60))
    assert spot is not None and (spot.position, spot.eta_s) == (2, 120.0)


def test_with_aging_a_waiting_job_is_passed_only_by_jobs_that_asked_within_its_steps_of_it():
    """SPILLWAY_POOL_AGING_S (60 s here): a priority-5 job is four steps from priority 1, so
    priority-1 jobs asking more than 240 s after it go behind it, however many keep coming."""
    b = book(("a40", 1))
    b.set_aging(MINUTE)
    b.ask(ask("holder"), T0)
    b.ask(ask("low", 1, priority=5), T0)
    for i in range(60):  # ten minutes of urgent jobs, one every 10 s
        b.ask(ask(f"urgent-{i}", 2 + 10 * i, priority=1), T0)
    order = [a.job_id for a in b.line]
    assert order[: order.index("low")] == [f"urgent-{i}" for i in range(24)]  # asked by 232 s
    # The places go in that order: "low" is the 25th admitted, not the 61st.
    admitted = []
    for _ in range(61):
        holder = next(iter(b.holders.values()))
        b.give_back(PoolLeave(job_id=holder.job_id, asked_at=holder.asked_at), T0)
        admitted += list(answers(b.admit(T0, freshness=timedelta(0))))
    assert admitted.index("low") == 24
    # Without aging (0): strict priority, the low job after all 60.
    b = book(("a40", 1))
    b.ask(ask("holder"), T0)
    b.ask(ask("low", 1, priority=5), T0)
    for i in range(60):
        b.ask(ask(f"urgent-{i}", 2 + 10 * i, priority=1), T0)
    assert [a.job_id for a in b.line][-1] == "low"


def test_a_job_waiting_for_headroom_takes_a_place_only_on_a_fresh_reading_that_shows_it():
    b = book(("a40", 1))
    b.ask(ask("holder"), T0)
    b.ask(ask("waits", 1, mode="headroom", seen=BUSY), T0)
    b.give_back(PoolLeave(job_id="holder", asked_at=T0), T0)
    later = T0 + timedelta(seconds=5)
    assert b.admit(later, freshness=timedelta(seconds=2)) == []
    assert [h.name for h in b.to_probe(later, timedelta(seconds=2))] == ["a40"]
    b.note_probe("a40", Reading(reachable=True, headroom=True, at=later))
    assert answers(b.admit(later, freshness=timedelta(seconds=2)))["waits"].host == "a40"


def test_a_rejected_job_asks_again_keeping_its_position_and_takes_a_place_whatever_the_load():
    b = book(("a40", 1))
    b.ask(ask("holder"), T0)
    b.ask(ask("first", 1, mode="headroom", seen=BUSY), T0)
    b.ask(ask("second", 2, mode="any", seen=BUSY), T0)
    b.ask(ask("first", 1, mode="any", seen=[]), T0)
    assert [a.job_id for a in b.line] == ["first", "second"]
    b.give_back(PoolLeave(job_id="holder", asked_at=T0), T0)
    assert answers(b.admit(T0, freshness=timedelta(0)))["first"].host == "a40"


def test_messages_of_an_earlier_ask_change_nothing_and_asking_again_gets_the_same_answer():
    b = book()
    b.ask(ask("j1"), T0)
    assert not b.give_back(PoolLeave(job_id="j1", asked_at=T0 - timedelta(seconds=1)), T0)
    assert answers(b.ask(ask("j1"), T0))["j1"].host == "a40"
    assert len(b.holders) == 1
    # A new ask of the same job (a reset run) waits until the job says its old place is free.
    assert b.ask(ask("j1", 9), T0) == [] and b.check_now(T0, SOON)
    b.free(b.holders["j1"], T0)
    assert answers(b.settle_parked(set(), T0))["j1"].host == "a40"
    assert [h.asked_at for h in b.holders.values()] == [T0 + timedelta(seconds=9)]


def test_a_give_back_frees_a_place_only_once_the_job_confirms_it_and_one_it_denies_is_dropped():
    b = book(("a40", 1))
    b.verify_leaves = True
    b.ask(ask("holder"), T0)
    b.ask(ask("next", 1), T0)
    # Anyone's give-back in the holder's name: the place stays held until the check.
    assert not b.give_back(PoolLeave(job_id="holder", asked_at=T0, prompt_id="p"), T0)
    assert b.admit(T0, freshness=SOON) == [] and b.check_now(T0, SOON)
    assert [h.job_id for h in b.unheard(T0, MINUTE, SOON)] == ["holder"]
    # The holder says it still holds its place: asked again after the reprobe, dropped after
    # LEAVE_CHECKS such answers (a download's give-back may come before the job knows).
    at = T0
    for n in range(LEAVE_CHECKS):
        at += timedelta(seconds=1)
        b.heard("holder", at)
        assert not b.check_now(at, SOON)
        if n < LEAVE_CHECKS - 1:
            assert b.next_leave_check(SOON) == at + SOON and b.check_now(at + SOON, SOON)
    assert b.next_leave_check(SOON) is None and b.holders["holder"].left_prompt is None
    # Its own give-back, confirmed by the check: free, and the line moves.
    b.give_back(PoolLeave(job_id="holder", asked_at=T0), at)
    assert b.free(b.holders["holder"], at)
    assert answers(b.admit(at, freshness=SOON))["next"].host == "a40"


def test_a_job_only_some_hosts_can_run_waits_for_those_and_the_line_moves_past_it():
    b = book(("a", 1), ("b", 1))
    both = [HostSeen(name=n, reachable=True, headroom=True) for n in ("a", "b")]
    assert answers(b.ask(ask("on-b", seen=both, unfit=["a"]), T0))["on-b"].host == "b"
    # "b" is full: a job only "b" can run waits for it, with "a" free, and hears only b's place.
    only_b = answers(b.ask(ask("only-b", 1, seen=both, unfit=["a"]), T0))["only-b"]
    assert (only_b.host, only_b.position, only_b.full) == (None, 1, ["gpu_places_full_b_1of1"])
    assert [h.name for h in b.to_probe(T0, SOON)] == []  # nobody in line can use "a"
    # A job any host can run goes past it to "a"; the line keeps "only-b" first for "b".
    assert answers(b.ask(ask("any", 2, seen=both), T0))["any"].host == "a"
    [why] = [i.why for i in b.view(T0).line]
    assert why == "places taken (b 1/1)"
    b.give_back(PoolLeave(job_id="on-b", asked_at=T0), T0)
    assert answers(b.admit(T0, freshness=SOON))["only-b"].host == "b"


def test_an_unreachable_host_takes_nobody_until_it_answers():
    b = book()
    lined = answers(b.ask(ask("j1", seen=DOWN), T0))["j1"]
    assert lined.position == 1 and not b.holders
    assert b.admit(T0, freshness=timedelta(seconds=2)) == []
    b.note_probe("a40", Reading(reachable=True, headroom=False, at=T0 + timedelta(seconds=2)))
    assert answers(b.admit(T0, freshness=timedelta(seconds=2)))["j1"].host == "a40"


def test_two_hosts_fill_the_one_with_more_free_places_first_then_say_both_are_full():
    b = book(("a", 1), ("b", 2))
    seen = [HostSeen(name=n, reachable=True, headroom=True) for n in ("a", "b")]
    hosts = [answers(b.ask(ask(f"j{i}", i, seen=seen, wait=False), T0))[f"j{i}"] for i in range(4)]
    assert sorted(str(a.host) for a in hosts[:3]) == ["a", "b", "b"]
    assert hosts[3].host is None
    assert hosts[3].full == ["gpu_places_full_a_1of1", "gpu_places_full_b_2of2"]


def test_the_book_survives_continue_as_new_and_the_view_lists_places_and_line():
    b = book(("a40", 1))
    b.ask(ask("holder"), T0)
    b.ask(ask("next", 1), T0)
    again = PoolBook(PoolInput.model_validate_json(b.carried(100, []).model_dump_json()))
    again.configure(list(b.hosts.values()))
    view = again.view(T0)
    assert [p.job_id for p in view.hosts[0].places] == ["holder"]
    assert [(i.job_id, i.position) for i in view.line] == [("next", 1)]


def test_a_reset_run_asking_anew_gives_its_old_place_to_the_line_and_waits_behind_it():
    b = book(("a40", 1))
    b.ask(ask("holder"), T0)
    b.ask(ask("next", 1), T0)
    assert b.ask(ask("holder", 5), T0) == []  # parked until the holder check
    assert b.check_now(T0, SOON) and [h.job_id for h in b.unheard(T0, MINUTE, SOON)] == ["holder"]
    b.free(b.holders["holder"], T0)  # the check: the job holds no place under its old ask
    sent = answers(b.settle_parked(set(), T0))
    assert sent["next"].host == "a40"
    assert sent["holder"].position == 1 and sent["holder"].asked_at == T0 + timedelta(seconds=5)
    assert [h.job_id for h in b.holders.values()] == ["next"]


def test_two_thousand_in_line_carry_less_than_temporal_warns_about():
    # Temporal warns at 512 KB per payload and refuses 2 MB. 2,000 uuid-named jobs with their
    # graph's shape carry 223 KB (111 bytes each): not the probe each came with, and no field
    # at its default.
    b = book()
    for i in range(2002):
        b.ask(ask(f"{i:08d}-7f3c-4a1e-9b2d-0c5e8a7d6f41", i, seen=BUSY, shape="0f" * 8), T0)
    carried = b.carried(500, []).model_dump_json()
    assert len(b.line) == 2000 and len(carried) < 512 * 1024, len(carried)


def test_the_line_says_why_each_job_waits_and_in_which_state():
    b = book(("a40", 1))
    b.ask(ask("holder"), T0)
    b.ask(ask("local", 1), T0)
    b.ask(ask("asks-a-person", 2, mode="headroom"), T0)
    line = {i.job_id: i for i in b.view(T0).line}
    assert (line["local"].state, line["local"].why) == ("queued", "places taken (a40 1/1)")
    assert line["asks-a-person"].state == "awaiting_approval"
    assert line["asks-a-person"].why == "approval, or a host with headroom"
    b.note_probe("a40", Reading(reachable=False, headroom=False, at=T0))
    assert b.view(T0).line[0].why == "no GPU host answers"


def test_a_job_in_line_asking_again_is_left_where_it_was_and_lined_by_a_pool_that_lost_it():
    b = book(("a40", 1))
    b.ask(ask("holder"), T0)
    b.ask(ask("first", 1, seen=[]), T0)
    b.ask(ask("second", 2, seen=[]), T0)
    assert b.ask(ask("second", 2, seen=[], again=True), T0) == []  # unanswered: nothing changed
    assert [a.job_id for a in b.line] == ["first", "second"]
    # A new pool that lost the line lines it again by its first ask time, and answers.
    fresh = book(("a40", 1))
    fresh.ask(ask("later", 5, seen=[]), T0)
    again = answers(fresh.ask(ask("second", 2, seen=[], again=True), T0))["second"]
    assert again.position == 1
    assert [a.job_id for a in fresh.line] == ["second", "later"]
    assert not any(a.again for a in fresh.line)


def test_an_ask_naming_a_holder_frees_nothing_while_the_job_still_holds_its_place():
    b = book(("a40", 1))
    b.ask(ask("holder"), T0)
    b.ask(ask("next", 1), T0)
    assert b.ask(ask("holder", 5), T0) == []  # a forged ask: another ask time, same job id
    assert [h.job_id for h in b.holders.values()] == ["holder"]
    assert b.settle_parked({"holder"}, T0) == []  # the check: the job still holds it
    assert not b.parked and [h.job_id for h in b.holders.values()] == ["holder"]
    assert [a.job_id for a in b.line] == ["next"]
    carried = b.carried(100, [])
    assert carried.parked == [] and len(carried.holders) == 1


def test_readings_of_hosts_nobody_configured_are_not_kept_and_oversized_asks_do_not_decode():
    b = book()
    made_up = [HostSeen(name=f"made-up-{i}", reachable=True, headroom=True) for i in range(60)]
    b.ask(ask("j1", seen=[*FREE, *made_up]), T0)
    assert list(b.readings) == ["a40"]
    b.configure([])  # a host no longer configured: what was known of it goes
    assert b.readings == {} and b.holds_s == {}
    for fields in (
        {"seen": [FREE[0]] * 65},
        {"job_id": "x" * 256},
        {"priority": 0},
    ):
        with pytest.raises(ValidationError):
            ask("j2", **fields)


def test_a_place_left_with_its_prompt_maybe_in_comfyui_stays_held_until_it_is_taken_out():
    b = book(("a40", 1))
    b.ask(ask("left"), T0)
    b.ask(ask("next", 1), T0)
    # Its host was lost under it: the prompt may still render there.
    assert not b.give_back(PoolLeave(job_id="left", asked_at=T0, prompt_id="p-1"), T0)
    assert b.admit(T0, freshness=timedelta(seconds=2)) == []  # the place is still held
    assert [(p.job_id, p.clearing) for p in b.view(T0).hosts[0].places] == [("left", "p-1")]
    # Another give-back of the same ask frees nothing while the prompt is not out, and the
    # holder check does not ask a job that has left.
    assert not b.give_back(PoolLeave(job_id="left", asked_at=T0), T0)
    assert b.unheard(T0 + timedelta(hours=1), MINUTE, SOON) == []
    [due] = b.to_clear(T0, timedelta(seconds=30))
    due.cleared_at = T0  # a try that failed: the next one 30 s later
    assert b.to_clear(T0 + timedelta(seconds=10), timedelta(seconds=30)) == []
    assert b.next_clear(T0, timedelta(seconds=30)) == T0 + timedelta(seconds=30)
    assert b.cleared(due, T0 + timedelta(seconds=31))
    assert answers(b.admit(T0, freshness=timedelta(seconds=2)))["next"].host == "a40"


def test_an_ask_showing_other_places_than_the_pool_s_is_told_apart():
    b = book(("a40", 1))
    assert not b.places_differ(ask("j1").places)  # a job of 0.5.0 shows none
    assert not b.places_differ(ask("j1", places={"a40": 1}).places)
    assert b.places_differ(ask("j1", places={"a40": 2}).places)
    assert b.places_differ(ask("j1", places={"a40": 1, "second": 1}).places)


X, Y, Z = ["wan2.2_14B.safetensors"], ["wan2.2_5B.safetensors"], ["hunyuan.gguf"]
BOTH = [HostSeen(name=n, reachable=True, headroom=True) for n in ("a", "b")]


def test_a_free_place_goes_to_the_host_whose_models_are_warm_before_the_one_with_more_free():
    b = book(("a", 2), ("b", 2))
    b.prefer_warm = True
    b.ask(ask("j1", models=Y, seen=BOTH), T0)  # a and b alike: the job's own order, a
    assert b.warm == {"a": Y}
    assert [h.warm for h in b.view(T0).hosts] == [Y, []]  # what `queue --json` and the console show
    # Carried across continue-as-new with the rest of the book.
    b2 = PoolBook(b.carried(500, []))
    b2.configure([PoolHost(ref=ref("q", n, 2), max_jobs=2) for n in ("a", "b")])
    b2.prefer_warm = True
    assert answers(b2.ask(ask("j2", 1, models=Y, seen=BOTH), T0))["j2"].host == "a"
    assert answers(b2.ask(ask("j3", 2, models=X, seen=BOTH), T0))["j3"].host == "b"
    # Not preferring warm models: the host with more free places.
    b.prefer_warm = False
    assert answers(b.ask(ask("j4", 3, models=Y, seen=BOTH), T0))["j4"].host == "b"


def test_a_job_whose_models_are_warm_passes_jobs_of_its_priority_at_most_twice_each():
    b = book(("a40", 1))
    b.prefer_warm = True
    b.ask(ask("holder", models=X), T0)
    for i, (job, models) in enumerate(
        [("cold-1", Y), ("cold-2", Y), ("warm-1", X), ("warm-2", X), ("warm-3", X)]
    ):
        b.ask(ask(job, 1 + i, models=models), T0)
    b.ask(ask("urgent", 9, models=X, priority=1), T0)
    admitted = []
    for _ in range(6):
        holder = next(iter(b.holders.values()))
        b.give_back(PoolLeave(job_id=holder.job_id, asked_at=holder.asked_at), T0)
        admitted += list(answers(b.admit(T0, freshness=timedelta(0))))
    # A job of another priority is never passed (the urgent one goes first); the cold ones are
    # passed twice, then go; warm-3 waits its turn
    # behind them (cold-2's models are warm once cold-1 ran).
    assert admitted == ["urgent", "warm-1", "warm-2", "cold-1", "cold-2", "warm-3"]
    # Not preferring warm models: strictly in order.
    b = book(("a40", 1))
    b.ask(ask("holder", models=X), T0)
    b.ask(ask("cold", 1, models=Y), T0)
    b.ask(ask("warm", 2, models=X), T0)
    b.give_back(PoolLeave(job_id="holder", asked_at=T0), T0)
    assert list(answers(b.admit(T0, freshness=timedelta(0)))) == ["cold"]


@pytest.mark.parametrize("seed", range(20))
def test_no_job_is_passed_more_than_the_bound_nor_by_another_priority(seed: int) -> None:
    """Three models on two one-place hosts, jobs of two priorities asking while places free in
    a random order: whenever a job takes a place, every job ahead of it in line that could
    have taken it counts a pass; none counts more than WARM_PASSES, and every pass is within
    one priority."""
    rng = random.Random(seed)
    b = book(("a", 1), ("b", 1))
    b.prefer_warm = True
    passes: dict[str, int] = {}
    for t in range(1, 121):
        if rng.random() < 0.7:
            job = f"j{t}"
            b.ask(
                ask(job, t, models=rng.choice([X, Y, Z]), priority=rng.choice([2, 3]), seen=BOTH),
                T0,
            )
        elif b.holders:
            holder = rng.choice(list(b.holders.values()))
            b.give_back(PoolLeave(job_id=holder.job_id, asked_at=holder.asked_at), T0)
        line = [a.job_id for a in b.line]
        prio = {a.job_id: a.priority for a in b.line}
        for job, _answer in b.admit(T0, freshness=timedelta(0)):
            ahead = line[: line.index(job)]
            assert all(prio[k] == prio[job] for k in ahead)
            for k in ahead:
                passes[k] = passes.get(k, 0) + 1
            line.remove(job)
    assert passes and max(passes.values()) <= WARM_PASSES == 2


def test_a_drained_host_gets_no_new_place_its_holders_finish_and_resume_gives_it_the_line():
    b = book(("a40", 2), ("b", 1))
    seen = [*FREE, HostSeen(name="b", reachable=True, headroom=True)]
    b.ask(ask("h1", seen=seen), T0)
    b.ask(ask("h2", 1, seen=seen), T0)
    b.ask(ask("h3", 2, seen=seen), T0)  # a40 has 2 places, b 1: all three are held
    assert {h.host for h in b.holders.values()} == {"a40", "b"}
    assert not b.drain(PoolDrain(host="a40", drain=True, by="ops", reason="driver update"), T0)
    for i in range(3):
        assert answers(b.ask(ask(f"w{i}", 3 + i, seen=seen), T0))[f"w{i}"].position == i + 1
    view = b.view(T0)
    assert view.line[0].why == "places taken (b 1/1); host a40 drained by ops: driver update"
    assert b.full_reasons() == ["gpu_host_drained_a40", "gpu_places_full_b_1of1"]
    # The holders on a40 finish; nobody new gets a place there, the line moves to b.
    later = T0 + MINUTE
    for holder in list(b.holders.values()):
        b.give_back(PoolLeave(job_id=holder.job_id, asked_at=holder.asked_at), later)
    sent = answers(b.admit(later, freshness=SOON))
    assert {job: a.host for job, a in sent.items()} == {"w0": "b"}
    assert b.in_use() == {"a40": 0, "b": 1}
    # Carried across continue-as-new; a drain again keeps its first time.
    b = PoolBook(b.carried(500, []))
    b.configure([PoolHost(ref=ref("q", n, m), max_jobs=m) for n, m in (("a40", 2), ("b", 1))])
    b.drain(PoolDrain(host="a40", drain=True, by="ops2"), later)
    drained = b.view(T0).hosts[0].drained
    assert drained is not None and (drained.by, drained.since) == ("ops2", T0)
    # Resumed: its free places go to the line at once.
    assert b.drain(PoolDrain(host="a40", drain=False, by="ops"), later)
    sent = answers(b.admit(later, freshness=SOON))
    assert {job: a.host for job, a in sent.items()} == {"w1": "a40", "w2": "a40"}
    assert b.view(T0).hosts[0].drained is None
    # A host the workers do not have is not drained.
    assert not b.drain(PoolDrain(host="nope", drain=True, by="ops"), later)
    assert "nope" not in b.drained


def test_the_eta_learns_renders_as_comfyui_timed_them_and_one_long_hold_does_not_spoil_it():
    b = book(("a40", 1))
    b.verify_leaves = True
    minute = T0 + MINUTE
    for i, render_s in enumerate([8.0, 8.5, 7.5]):
        job = f"r{i}"
        b.ask(ask(job, i), T0)
        # The job gives its place back with its render's time; the holder check confirms it.
        b.give_back(
            PoolLeave(job_id=job, asked_at=T0 + timedelta(seconds=i), render_s=render_s), minute
        )
        holder = b.holders[job]
        assert b.free(holder, minute)
    # A job that gave its place back after 17 minutes without a render time (a worker of 0.5.0,
    # a spillway stopped mid-render): its hold counts, but the median keeps the estimate.
    b.ask(ask("slow", 10), T0)
    b.give_back(PoolLeave(job_id="slow", asked_at=T0 + timedelta(seconds=10)), T0 + 17 * MINUTE)
    assert b.free(b.holders["slow"], T0 + 17 * MINUTE)
    assert b.holds_s["a40"] == [8.0, 8.5, 7.5, 17 * 60.0]
    # Not learnt: a holder that ended without giving its place back (terminated), and one
    # adopted from an earlier pool.
    b.ask(ask("gone", 20), T0)
    assert b.free(b.holders["gone"], T0 + 30 * MINUTE)
    b.adopt("adopted", T0, "a40", T0)
    b.give_back(PoolLeave(job_id="adopted", asked_at=T0), T0 + 40 * MINUTE)
    assert b.free(b.holders["adopted"], T0 + 40 * MINUTE)
    assert len(b.holds_s["a40"]) == 4
    b.ask(ask("holder", 30), T0)
    b.ask(ask("next", 31), T0)
    spot = b.spot("next", T0)
    assert spot is not None and spot.eta_s == 8.2  # the median of 7.5, 8, 8.5 and 1020: 8.25


def test_the_line_s_estimate_follows_the_held_render_and_grows_once_it_outlasts_the_recent_ones():
    b = book(("a40", 1))
    b.holds_s["a40"] = [8.0, 10.0, 12.0]
    b.ask(ask("holder"), T0)
    b.ask(ask("next", 1), T0)

    def eta(s: int) -> float | None:
        spot = b.spot("next", T0 + timedelta(seconds=s))
        assert spot is not None
        return spot.eta_s

    # While it renders within the recent renders, it ends as the ones that outlasted it so far.
    assert [eta(s) for s in (0, 5, 9, 11)] == [
        10.0,  # 8, 10, 12 from now: their median
        5.0,
        2.0,  # 10 and 12 outlasted 9 s: 1 and 3 s more
        1.0,  # only 12 did
    ]
    # Past all of them, a typical render more: its start moves on while it renders on.
    assert eta(13) == eta(60) == 10.0


def test_a_job_waiting_by_its_patience_is_told_once_when_the_estimate_passes_it():
    b = book(("a40", 1))
    b.holds_s["a40"] = [10.0, 10.0, 10.0]
    b.ask(ask("holder"), T0)
    patient = ask("patient", 1, start_by=T0 + timedelta(seconds=30))
    lined = answers(b.ask(patient, T0 + timedelta(seconds=1)))["patient"]
    assert (lined.position, lined.eta_s, lined.late) == (1, 9.0, False)
    assert b.late(T0 + timedelta(seconds=15)) == []
    # The holder outlasted every recent render at 10 s: a typical render more from now, so the
    # estimate passes 30 s at 20 s.
    assert b.next_late(T0 + timedelta(seconds=15)) == T0 + timedelta(seconds=20)
    assert b.late(T0 + timedelta(seconds=20)) == []
    [(job, told)] = b.late(T0 + timedelta(seconds=21))
    assert (job, told.position, told.eta_s, told.late) == ("patient", 1, 10.0, True)
    assert b.late(T0 + timedelta(seconds=25)) == [] and b.next_late(T0) is None  # told once


def test_an_ask_already_past_its_patience_hears_it_in_its_answer_a_deadline_counting_a_render():
    b = book(("a40", 1))
    b.holds_s["a40"] = [10.0]
    b.ask(ask("holder"), T0)
    # Its deadline is 15 s away: a 10 s start and a 10 s render do not fit before it.
    by_deadline = ask("d", 1, start_by=T0 + timedelta(seconds=15), by_deadline=True)
    told = answers(b.ask(by_deadline, T0))["d"]
    assert (told.position, told.eta_s, told.late) == (1, 10.0, True)
    assert b.late(T0) == []  # told in its answer


def test_the_estimate_takes_renders_of_each_job_s_own_shape_where_it_has_seen_some():
    b = book(("a40", 1))
    # A 2 s test image and a 100 s video render seen; a shape never seen takes them all.
    for job, shape, took in [("i1", "image", 2.0), ("v1", "video", 100.0), ("i2", "image", 2.0)]:
        b.ask(ask(job, shape=shape), T0)
        assert b.give_back(PoolLeave(job_id=job, asked_at=T0, render_s=took), T0)
    assert b.shape_holds == {"video": [100.0], "image": [2.0, 2.0]}
    b.ask(ask("video-holder", 1, shape="video"), T0)
    b.ask(ask("image-next", 2, shape="image"), T0)
    b.ask(ask("after", 3, shape="new"), T0)
    spots = {j: b.spot(j, T0) for j in ("image-next", "after")}
    assert {j: s.eta_s for j, s in spots.items() if s is not None} == {
        "image-next": 100.0,  # behind a video render
        "after": 102.0,  # and a 2 s image
    }
    quoted = b.quote(ask("q", 4, shape="video", seen=BUSY), T0)
    assert (quoted.position, quoted.eta_s, quoted.render_s) == (3, 102.0 + 2.0, 100.0)


# --- the estimate counts only the places a job could take (issue 59, item 4) --------------------

A_B = [HostSeen(name=n, reachable=True, headroom=True) for n in ("a", "b")]


@pytest.mark.parametrize(
    ("places", "line", "expected"),
    [
        # One host, two places: the first two start when the places free, the third behind.
        ({"a": [0.0, 5.0]}, [({"a"}, 10.0)] * 3, [0.0, 5.0, 10.0]),
        # A job ahead that only "a" can run does not delay one that only "b" can.
        ({"a": [10.0], "b": [10.0]}, [({"a"}, 10.0)] * 4 + [({"b"}, 10.0)], [10, 20, 30, 40, 10]),
        # A job that may use either takes the place that frees first, wherever it is.
        ({"a": [30.0], "b": [10.0]}, [({"a", "b"}, 10.0), ({"b"}, 10.0)], [10.0, 20.0]),
        # None of its hosts usable (drained, not answering, not configured): not known.
        ({"a": [0.0]}, [({"b"}, 10.0), ({"a"}, 10.0)], [None, 0.0]),
        ({}, [({"a"}, 10.0)], [None]),
    ],
)
def test_each_job_starts_on_the_first_place_that_frees_among_the_hosts_it_can_use(
    places: dict[str, list[float]],
    line: list[tuple[set[str], float]],
    expected: list[float | None],
) -> None:
    assert starts(places, [Waiter(hosts, render) for hosts, render in line]) == expected


@pytest.mark.parametrize(
    ("max_jobs", "frees", "expected"),
    [
        (2, [], [0.0, 0.0]),
        (2, [7.0], [7.0, 0.0]),
        (2, [9.0, 3.0], [3.0, 9.0]),
        # Three held where a deploy left two places: the line's first place frees at the second
        # holder's end.
        (2, [10.0, 20.0, 30.0], [20.0, 30.0]),
        (0, [5.0], []),
    ],
)
def test_a_host_s_places_free_as_its_holders_end(
    max_jobs: int, frees: list[float], expected: list[float]
) -> None:
    assert host_places(max_jobs, frees) == expected


def test_a_job_only_b_runs_behind_four_only_a_runs_is_not_told_late_when_b_frees_in_time():
    b = book(("a", 1), ("b", 1))
    b.holds_s = {"a": [10.0], "b": [10.0]}
    b.ask(ask("on-a", seen=A_B, unfit=["b"]), T0)
    b.ask(ask("on-b", seen=A_B, unfit=["a"]), T0)
    for i in range(4):
        b.ask(ask(f"only-a{i}", i + 1, seen=A_B, unfit=["b"]), T0)
    patient = ask("only-b", 9, seen=A_B, unfit=["a"], start_by=T0 + timedelta(seconds=20))
    told = answers(b.ask(patient, T0))["only-b"]
    # Fifth in line, but only the holder of "b" is ahead of it there: it starts in 10 s.
    assert (told.position, told.eta_s, told.late) == (5, 10.0, False)
    assert b.late(T0 + timedelta(seconds=5)) == []
    assert not b.confirm_late(patient, T0).late
    assert [i.eta_s for i in b.view(T0).line] == [10.0, 20.0, 30.0, 40.0, 10.0]


@pytest.mark.parametrize("away", ["drained", "unreachable"])
def test_the_places_of_a_drained_or_unreachable_host_are_not_counted_free(away: str):
    b = book(("a", 1), ("b", 1))
    b.holds_s = {"b": [10.0]}
    b.ask(ask("on-b", seen=A_B, unfit=["a"]), T0)
    if away == "drained":
        b.drain(PoolDrain(host="a", drain=True, by="ops"), T0)
    else:
        b.note_probe("a", Reading(reachable=False, headroom=False, at=T0))
    either = answers(b.ask(ask("either", 1, seen=[]), T0))["either"]
    only_a = answers(b.ask(ask("only-a", 2, seen=[], unfit=["b"]), T0))["only-a"]
    # "a"'s free place takes nobody: "either" starts when "b" frees, "only-a" is not known.
    assert (either.position, either.eta_s) == (1, 10.0)
    assert (only_a.position, only_a.eta_s) == (2, None)


def test_an_ask_forged_with_a_short_patience_makes_nothing_late_that_the_job_can_confirm():
    b = book(("a40", 1))
    b.holds_s["a40"] = [10.0]
    b.ask(ask("holder"), T0)
    patient = ask("patient", 1, start_by=T0 + timedelta(seconds=600))
    assert not answers(b.ask(patient, T0))["patient"].late
    # Anyone with signal rights asks in its name, with its ask time and a patience long past:
    # the pool keeps the patience the job lined up with and tells nobody `late`.
    past = {"start_by": T0 - timedelta(seconds=1)}
    forged = patient.model_copy(update=past)
    sent = b.ask(forged, T0 + timedelta(seconds=1))
    assert [a.late for _, a in sent] == [False] and b.late(T0 + timedelta(seconds=2)) == []
    # Or takes it out of the line first, then asks in its name: a patience over when it
    # arrives is nobody's, and one short but not over yet is told, but the job's own ask (its
    # own patience) is not late by the pool's estimate: it waits on.
    b.give_back(PoolLeave(job_id="patient", asked_at=patient.asked_at), T0)
    assert [a.late for _, a in b.ask(forged, T0 + timedelta(seconds=2))] == [False]
    b.give_back(PoolLeave(job_id="patient", asked_at=patient.asked_at), T0)
    soon = patient.model_copy(update={"start_by": T0 + timedelta(seconds=3)})
    assert [a.late for _, a in b.ask(soon, T0 + timedelta(seconds=2))] == [True]
    assert b.confirm_late(patient, T0 + timedelta(seconds=2)).model_dump() == {
        "lined": True,
        "position": 1,
        "eta_s": 8.0,
        "late": False,
    }
    # Demoted in its name (priority 5, behind later asks): the check takes its own priority.
    b.ask(ask("later", 5, start_by=T0 + timedelta(seconds=900)), T0 + timedelta(seconds=5))
    b.ask(patient.model_copy(update={"priority": 5}), T0 + timedelta(seconds=5))
    assert [a.job_id for a in b.line] == ["later", "patient"]
    assert b.confirm_late(patient, T0 + timedelta(seconds=5)).position == 1
    # An ask the pool does not have in line (another ask time) is never late.
    other = patient.model_copy(update={"asked_at": T0 + timedelta(seconds=7)})
    assert b.confirm_late(other, T0 + timedelta(seconds=5)).model_dump()["lined"] is False


def test_a_pool_that_has_seen_no_render_tells_no_patient_job_late():
    b = book(("a40", 1))
    b.ask(ask("holder"), T0)
    patient = ask("patient", 1, start_by=T0 + timedelta(seconds=5))
    told = answers(b.ask(patient, T0))["patient"]
    assert (told.eta_s, told.late) == (None, False)
    assert b.late(T0 + timedelta(seconds=4)) == [] and b.next_late(T0) is None
    assert b.confirm_late(patient, T0 + timedelta(seconds=4)).late is False


def hosts_at(*hosts: tuple[str, str]) -> list[PoolHost]:
    """Hosts of two places each, at the ComfyUI URLs given."""
    return [PoolHost(ref=ref("q", name, 2, url), max_jobs=2) for name, url in hosts]


def test_a_host_renamed_under_held_places_counts_them_until_they_end():
    b = PoolBook(PoolInput())
    b.configure(hosts_at(("gpu-a", "http://gpu-a:8188")))
    old = [HostSeen(name="gpu-a", reachable=True, headroom=True)]
    b.ask(ask("j1", seen=old), T0)
    b.ask(ask("j2", 1, seen=old), T0)
    # routing_tiers.json names it anew (its URL spelt otherwise): one card, the same two places.
    b.configure(hosts_at(("a40", "HTTP://GPU-A:8188/")))
    new = [HostSeen(name="a40", reachable=True, headroom=True)]
    assert answers(b.ask(ask("j3", 2, seen=new), T0))["j3"].position == 1
    assert b.in_use() == {"a40": 2}
    assert b.full_reasons() == ["gpu_places_full_a40_2of2"]
    assert b.to_probe(T0 + MINUTE, SOON) == []
    view = b.view(T0)
    assert [(h.name, h.max_jobs, [p.job_id for p in h.places]) for h in view.hosts] == [
        ("a40", 2, ["j1", "j2"])
    ]
    assert view.line[0].why == "places taken (a40 2/2)"
    # So across continue-as-new, and until they end: then the line has the place.
    b = PoolBook(PoolInput.model_validate_json(b.carried(500, []).model_dump_json()))
    assert b.in_use() == {"a40": 2}
    assert b.give_back(PoolLeave(job_id="j1", asked_at=T0), T0 + MINUTE)
    sent = answers(b.admit(T0 + MINUTE, freshness=SOON))
    assert {job: a.host for job, a in sent.items()} == {"j3": "a40"}
    assert b.in_use() == {"a40": 2} and b.holders["j3"].comfyui == "http://gpu-a:8188"


def test_holders_of_a_gone_name_count_nowhere_when_no_one_host_has_their_comfyui():
    """A loopback URL names each agent's own machine: two hosts may share it, and a holder of
    a name gone counts on neither (nor does one a pool before this kept no ComfyUI for)."""
    b = PoolBook(PoolInput())
    b.configure(hosts_at(("a40", "http://127.0.0.1:8188"), ("rtx", "http://127.0.0.1:8188")))
    seen = [HostSeen(name="a40", reachable=True, headroom=True)]
    b.ask(ask("j1", seen=seen), T0)
    b.adopt("j2", T0, "a40", T0)
    assert b.holders["j2"].comfyui == "http://127.0.0.1:8188"
    b.holders["j2"].comfyui = None
    b.configure(hosts_at(("a40x", "http://127.0.0.1:8188"), ("rtx", "http://127.0.0.1:8188")))
    assert b.in_use() == {"a40x": 0, "rtx": 0}
    assert [(h.name, h.max_jobs, len(h.places)) for h in b.view(T0).hosts] == [
        ("a40", 0, 2),
        ("a40x", 2, 0),
        ("rtx", 2, 0),
    ]
    assert b.host_of(b.holders["j1"]) is None


def _lined_book() -> PoolBook:
    """One place held, `first` then `second` in line, the pool taking changes on the job's own
    word only (pools from `gpu-pool-own-word`)."""
    b = book(("a40", 1))
    b.confirm_changes = True
    b.ask(ask("holder"), T0)
    b.ask(ask("first", 1), T0)
    b.ask(ask("second", 2), T0)
    return b


def _own(job: PoolAsk, **changed: object) -> JobPlace:
    """The job's own place, as its `place` query answers."""
    return JobPlace.model_validate(
        {"asked_at": job.asked_at, "mode": job.mode, "priority": job.priority} | changed
    )


@pytest.mark.parametrize(
    "forged",
    [
        {"priority": 1},
        {"mode": "headroom"},
        {"priority": 1, "unfit": ["a40"], "start_by": T0 + timedelta(seconds=5)},
        {"asked_at": T0 - timedelta(hours=1)},  # to the head of the line
    ],
    ids=["priority", "mode", "hosts-and-patience", "an-earlier-ask-time"],
)
def test_an_ask_in_a_lined_job_s_name_changes_nothing_its_own_place_does_not_show(forged):
    b = _lined_book()
    second = b._lined["second"]
    message = ask("second", 2, seen=[]).model_copy(update=forged)
    assert b.ask(message, T0) == []  # nothing answered, nothing moved yet
    assert list(b.changing) == ["second"]
    sent, dropped = b.changes_confirmed({"second": _own(second)}, T0)
    assert (sent, dropped) == ([], ["second"])
    assert [a.job_id for a in b.line] == ["first", "second"]
    kept = b._lined["second"]
    assert (kept.asked_at, kept.priority, kept.mode, kept.unfit, kept.start_by) == (
        second.asked_at,
        3,
        "any",
        [],
        None,
    )


def test_a_change_the_job_s_own_place_shows_moves_it_and_a_repeat_is_answered_at_once():
    b = _lined_book()
    second = b._lined["second"]
    repeat = answers(b.ask(ask("second", 2, seen=[]), T0))["second"]
    assert repeat.position == 2 and not b.changing  # its own ask again: where it is
    b.ask(ask("second", 2, seen=[], priority=1), T0)  # `spillway priority` moved it
    sent, dropped = b.changes_confirmed({"second": _own(second, priority=1)}, T0)
    assert dropped == [] and answers(sent)["second"].position == 1
    assert [a.job_id for a in b.line] == ["second", "first"]


def test_a_new_ask_time_the_job_s_own_place_shows_takes_the_line_s_one():
    """A run reset to before its ask asks anew while its earlier ask waits in line."""
    b = _lined_book()
    anew = ask("first", 30, seen=[])
    b.ask(anew, T0 + timedelta(seconds=30))
    assert [a.job_id for a in b.line] == ["first", "second"]
    sent, _ = b.changes_confirmed({"first": _own(anew)}, T0 + timedelta(seconds=30))
    assert answers(sent)["first"].position == 2
    assert [(a.job_id, a.asked_at) for a in b.line] == [
        ("second", T0 + timedelta(seconds=2)),
        ("first", T0 + timedelta(seconds=30)),
    ]


@pytest.mark.parametrize("seed", range(20))
def test_the_line_s_kept_estimate_is_the_estimate_from_the_head_whatever_happened_between(
    seed: int,
):
    # The book keeps the line's estimate between answers (a burst lined at the end costs time
    # linear in the line); after asks of any priority, shape and hosts, give-backs, leaves, time
    # passing and renders learned, every start it gives is the one taken from the line's head.
    rng = random.Random(seed)
    b = book(("a40", 2), ("b", 1))
    b.verify_leaves = False
    now, asked = T0, 0
    for step in range(120):
        roll = rng.random()
        if roll < 0.55:
            asked += 1
            hosts = rng.choice([["a40", "b"], ["a40"], ["b"]])
            seen = [HostSeen(name=h, reachable=True, headroom=True) for h in hosts]
            fields = {"priority": rng.randint(1, 5), "seen": seen}
            if rng.random() < 0.5:
                fields["shape"] = rng.choice(["aa" * 8, "bb" * 8])
            if hosts != ["a40", "b"]:
                fields["unfit"] = [h for h in ("a40", "b") if h not in hosts]
            b.ask(ask(f"j{asked}", asked, **fields), now)
        elif roll < 0.75 and b.holders:
            held = rng.choice(list(b.holders.values()))
            leave = PoolLeave(
                job_id=held.job_id, asked_at=held.asked_at, render_s=rng.uniform(5, 90)
            )
            b.give_back(leave, now)
            b.admit(now, freshness=SOON)
        elif roll < 0.85 and b.line:
            lined = rng.choice(b.line)
            b.give_back(PoolLeave(job_id=lined.job_id, asked_at=lined.asked_at), now)
        else:
            now += timedelta(seconds=rng.choice([0, 1, 7, 30]))
        fresh = b._etas(now, list(b.line))
        assert b._line_etas(now, len(b.line)) == fresh, step
        if b.line:
            k = rng.randrange(len(b.line))
            assert b._line_etas(now, k + 1)[-1] == fresh[k]
            other = ask("quote", asked + 1, shape=rng.choice([None, "aa" * 8]))
            assert b._eta_behind(now, k, other) == b._etas(now, [*b.line[:k], other])[-1]
