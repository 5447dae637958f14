"""Who may take whose place (spillway/core/preemption.py): every rule and bound, as a table."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from spillway.core.preemption import PreemptMode, Running, Shares, Waiting, victim

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
URGENT = Waiting(job_id="urgent", priority=1, team="film")
FAIR = Shares(below=frozenset({"ads"}), above=frozenset({"film"}))


def running(
    job_id: str,
    priority: int = 5,
    *,
    team: str = "film",
    at_s: float = 0.0,
    rendered_s: float = 10.0,
    before: bool = False,
) -> Running:
    return Running(
        job_id=job_id,
        priority=priority,
        team=team,
        since=T0 + timedelta(seconds=at_s),
        rendered_s=rendered_s,
        preempted_before=before,
    )


CASES: list[tuple[str, PreemptMode, Waiting, list[Running], Shares, str | None]] = [
    ("off never preempts", "off", URGENT, [running("batch")], Shares(), None),
    ("two steps lower is preempted", "priority", URGENT, [running("b", 3)], Shares(), "b"),
    ("one step lower is not", "priority", URGENT, [running("b", 2)], Shares(), None),
    (
        "the same priority never is",
        "priority",
        Waiting("w", 3, "film"),
        [running("b", 3)],
        Shares(),
        None,
    ),
    (
        "the lowest priority goes first",
        "priority",
        URGENT,
        [running("p4", 4, at_s=5), running("p5", 5, at_s=0)],
        Shares(),
        "p5",
    ),
    (
        "of equal priority, the latest admitted",
        "priority",
        URGENT,
        [running("early", at_s=0), running("late", at_s=9)],
        Shares(),
        "late",
    ),
    (
        "never one rendering longer than the limit",
        "priority",
        URGENT,
        [running("long", rendered_s=121.0)],
        Shares(),
        None,
    ),
    (
        "the limit itself still may be",
        "priority",
        URGENT,
        [running("at", rendered_s=120.0)],
        Shares(),
        "at",
    ),
    (
        "past the limit, the next one",
        "priority",
        URGENT,
        [running("long", at_s=9, rendered_s=300.0), running("short", at_s=0)],
        Shares(),
        "short",
    ),
    (
        "never the same job twice",
        "priority",
        URGENT,
        [running("again", before=True)],
        Shares(),
        None,
    ),
    (
        "never itself",
        "priority",
        URGENT,
        [running("urgent")],
        Shares(),
        None,
    ),
    (
        "priority mode ignores shares",
        "priority",
        Waiting("ad", 3, "ads"),
        [running("film-job", 3)],
        FAIR,
        None,
    ),
    (
        "fair: a team below its share takes from one above",
        "fair",
        Waiting("ad", 3, "ads"),
        [running("film-job", 3)],
        FAIR,
        "film-job",
    ),
    (
        "fair: never from a team at its share",
        "fair",
        Waiting("ad", 3, "ads"),
        [running("vfx-job", 3, team="vfx")],
        FAIR,
        None,
    ),
    (
        "fair: never within one team",
        "fair",
        Waiting("ad", 3, "ads"),
        [running("ad-2", 3, team="ads")],
        Shares(below=frozenset({"ads"}), above=frozenset({"ads"})),
        None,
    ),
    (
        "fair: a team above its share takes nothing by share",
        "fair",
        Waiting("f", 3, "film"),
        [running("ad-job", 3, team="ads")],
        FAIR,
        None,
    ),
    (
        "fair keeps the priority rule",
        "fair",
        URGENT,
        [running("b", 3, team="ads")],
        FAIR,
        "b",
    ),
    (
        "fair keeps the bounds",
        "fair",
        Waiting("ad", 3, "ads"),
        [running("film-job", 3, rendered_s=500.0)],
        FAIR,
        None,
    ),
]


@pytest.mark.parametrize(
    ("mode", "waiting", "jobs", "shares", "chosen"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_preemption(
    mode: PreemptMode, waiting: Waiting, jobs: list[Running], shares: Shares, chosen: str | None
):
    found = victim(mode, waiting, jobs, max_run_s=120.0, shares=shares)
    assert (found.job_id if found else None) == chosen
