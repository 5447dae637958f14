"""Preemption in the GPU pool's book (docs/design.md, "Preemption"; SPILLWAY_PREEMPT): who is
told to let go, that the place it lets go of goes to its preemptor and nobody else, that the
victim waits in line again at its first ask time once a holder check confirms it let go, and
that nothing is preempted with it off or twice. Without a server."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from spillway.core.gpu_pool import HostSeen, PoolAnswer, PoolAsk, PoolHost, PoolInput, PoolLeave
from spillway.core.hosts import ref
from spillway.core.pool_book import PoolBook

T0 = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
FREE = [HostSeen(name="a40", reachable=True, headroom=True)]
NOW = timedelta(0)


def book(places: int = 1, preempt: str = "priority", inp: PoolInput | None = None) -> PoolBook:
    b = PoolBook(inp or PoolInput())
    b.configure([PoolHost(ref=ref("q", "a40", places), max_jobs=places)])
    b.preempt = preempt  # type: ignore[assignment]
    b.verify_leaves = True
    return b


def ask(job: str, s: float = 0, **fields: object) -> PoolAsk:
    return PoolAsk.model_validate(
        {"job_id": job, "asked_at": T0 + timedelta(seconds=s), "seen": FREE} | fields
    )


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def let_go(b: PoolBook, job: str, s: float) -> list[tuple[str, PoolAnswer]]:
    """The victim gives its place back, and the holder check confirms it (the job no longer
    holds that place): what the pool answers then."""
    held = b.holders[job]
    b.give_back(PoolLeave(job_id=job, asked_at=held.asked_at), at(s))
    b.free(held, at(s))
    return b.admit(at(s), freshness=NOW)


def test_an_urgent_job_is_given_the_place_of_a_batch_render_once_it_has_let_go():
    b = book(places=1)
    b.ask(ask("batch", 0, priority=5), at(0))
    sent = dict(b.ask(ask("urgent", 10, priority=1), at(10)))
    order = sent["batch"]
    assert order.preempted_by == "urgent" and order.host == "a40"
    assert sent["urgent"].position == 1
    assert b.view(at(10)).hosts[0].places[0].preempted_by == "urgent"
    assert b.view(at(10)).preemptions == 1
    # Still held until the batch job let go: nobody else takes it meanwhile.
    assert dict(b.ask(ask("other", 11, priority=1), at(11)))["other"].position == 2
    assert "urgent" not in b.holders

    # The victim asks again at its first ask time before the pool has confirmed its leave.
    assert b.ask(ask("batch", 0, priority=5, preempted_by="urgent"), at(12)) == []
    admitted = dict(let_go(b, "batch", 12))
    assert admitted["urgent"].host == "a40"
    assert set(b.holders) == {"urgent"}
    # The parked ask is lined once the holder is gone: at its first ask time, behind the
    # higher priority, and never preempted again.
    lined = dict(b.settle_parked(set(), at(12)))
    assert lined["batch"].position == 2
    assert [a.job_id for a in b.line] == ["other", "batch"]
    assert b.view(at(12)).line[1].preempted_by == "urgent"


def test_a_freed_place_on_another_host_changes_nothing_promised():
    b = book(places=1)
    b.ask(ask("batch", 0, priority=5), at(0))
    b.ask(ask("urgent", 10, priority=1), at(10))
    # A place let go of is the preemptor's even when a job of the same priority asked first.
    b.ask(ask("early", 5, priority=1), at(11))
    admitted = dict(let_go(b, "batch", 12))
    assert list(admitted) == ["urgent"]


def test_nothing_is_preempted_when_it_is_off_one_step_lower_or_rendering_too_long():
    off = book(places=1, preempt="off")
    off.ask(ask("batch", 0, priority=5), at(0))
    assert [j for j, a in off.ask(ask("urgent", 1, priority=1), at(1))] == ["urgent"]

    close = book(places=1)
    close.ask(ask("batch", 0, priority=3), at(0))
    sent = close.ask(ask("urgent", 1, priority=2), at(1))
    assert all(a.preempted_by is None for _, a in sent)

    long = book(places=1)
    long.preempt_max_run_s = 120
    long.ask(ask("batch", 0, priority=5), at(0))
    sent = long.ask(ask("urgent", 121, priority=1), at(121))
    assert all(a.preempted_by is None for _, a in sent)


def test_one_victim_per_waiting_job_the_lowest_priority_then_the_latest_admitted():
    b = book(places=3)
    b.ask(ask("p4", 0, priority=4), at(0))
    b.ask(ask("p5-first", 1, priority=5), at(1))
    b.ask(ask("p5-latest", 2, priority=5), at(2))
    sent = dict(b.ask(ask("urgent", 3, priority=1), at(3)))
    assert sent["p5-latest"].preempted_by == "urgent"
    assert "p5-first" not in sent and "p4" not in sent
    # Asked again (its answer may be lost), the preemptor takes no second victim.
    assert all(a.preempted_by is None for _, a in b.ask(ask("urgent", 3, priority=1), at(4)))
    sent = dict(b.ask(ask("urgent-2", 5, priority=2), at(5)))
    assert sent["p5-first"].preempted_by == "urgent-2"


def test_a_job_preempted_once_is_never_preempted_again():
    b = book(places=1)
    b.ask(ask("batch", 0, priority=5, preempted_by="someone"), at(0))
    sent = b.ask(ask("urgent", 1, priority=1), at(1))
    assert all(a.preempted_by is None for _, a in sent)


def test_a_preemptor_that_left_the_line_leaves_the_place_to_the_line():
    b = book(places=1)
    b.ask(ask("batch", 0, priority=5), at(0))
    b.ask(ask("urgent", 10, priority=1), at(10))
    b.ask(ask("next", 11, priority=3), at(11))
    b.give_back(PoolLeave(job_id="urgent", asked_at=at(10)), at(12))  # cancelled
    admitted = dict(let_go(b, "batch", 13))
    assert list(admitted) == ["next"]


def test_a_preemption_under_way_is_carried_across_continue_as_new():
    b = book(places=1)
    b.ask(ask("batch", 0, priority=5), at(0))
    b.ask(ask("urgent", 10, priority=1), at(10))
    carried = PoolInput.model_validate(b.carried(500, []).model_dump(mode="json"))
    after = book(places=1, inp=carried)
    assert after.holders["batch"].preempted_by == "urgent"
    assert after.view(at(11)).preemptions == 1
    # Nothing preempted twice for it after the new run, and the place is still promised.
    assert all(a.preempted_by is None for _, a in after.admit(at(11), freshness=NOW))
    held = after.holders["batch"]
    after.give_back(PoolLeave(job_id="batch", asked_at=held.asked_at), at(12))
    after.free(held, at(12))
    carried = PoolInput.model_validate(after.carried(500, []).model_dump(mode="json"))
    again = book(places=1, inp=carried)
    assert again.promised == {"urgent": "a40"}
    assert dict(again.admit(at(13), freshness=NOW))["urgent"].host == "a40"


def test_fair_lets_a_team_below_its_share_take_a_place_from_a_team_above_it():
    b = book(places=2, preempt="fair")
    b.set_teams({"film": 1.0, "ads": 1.0}, "film", {})
    b.ask(ask("film-1", 0, team="film"), at(0))
    b.ask(ask("film-2", 1, team="film"), at(1))
    sent = dict(b.ask(ask("ads-1", 2, team="ads"), at(2)))
    assert sent["film-2"].preempted_by == "ads-1"
    # At its share, a team takes nothing more by preemption.
    b2 = book(places=2, preempt="fair")
    b2.set_teams({"film": 1.0, "ads": 1.0}, "film", {})
    b2.ask(ask("film-1", 0, team="film"), at(0))
    b2.ask(ask("ads-1", 1, team="ads"), at(1))
    assert all(a.preempted_by is None for _, a in b2.ask(ask("ads-2", 2, team="ads"), at(2)))
