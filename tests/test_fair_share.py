"""Who a freed GPU place goes to when several teams wait (spillway/core/fair_share.py): a table of
the rule's cases, then the claim it exists for, over random arrivals through the pool's book."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from spillway.core.fair_share import Turns, next_team, served
from spillway.core.gpu_pool import HostSeen, PoolAsk, PoolHost, PoolInput, PoolLeave
from spillway.core.hosts import ref
from spillway.core.pool_book import PoolBook

T0 = datetime(2026, 12, 6, 9, 0, tzinfo=UTC)
SHARES = {"film": 1.0, "ads": 2.0, "games": 3.0}

ROWS = [
    # (why, waiting in line order, held, turns, the team)
    ("nobody waits", [], {}, Turns(), None),
    ("one team alone takes the place whatever it holds", ["film"], {"film": 5}, Turns(), "film"),
    (
        "the earliest turn first",
        ["film", "ads"],
        {},
        Turns(clock=1.0, next={"film": 2.0, "ads": 1.5}),
        "ads",
    ),
    (
        "equal turns: the smaller share, whose next turn is the furthest away",
        ["ads", "film"],
        {"film": 1},
        Turns(),
        "film",
    ),
    (
        "equal turns and shares: the fewest places held per unit of share",
        ["film", "gone"],
        {"film": 2, "gone": 1},
        Turns(),
        "gone",
    ),
    (
        "equal turns and places per share: the line's order",
        ["ads", "games"],
        {"ads": 2, "games": 3},
        Turns(),
        "ads",
    ),
    (
        "a team that waited for nothing comes back at the clock, with nothing banked",
        ["film", "games"],
        {},
        Turns(clock=10.0, next={"film": 0.0, "games": 10.0 + 1 / 3}),
        "film",
    ),
    (
        "its turn ahead of the clock is not taken back by a team that comes back",
        ["games", "film"],
        {},
        Turns(clock=10.0, next={"film": 11.0}),
        "games",
    ),
    (
        "a team not in the file counts as share 1",
        ["gone", "film"],
        {"gone": 1, "film": 1},
        Turns(),
        "gone",
    ),
]


@pytest.mark.parametrize(
    ("why", "waiting", "held", "turns", "team"), ROWS, ids=[r[0] for r in ROWS]
)
def test_the_team_a_freed_place_goes_to(
    why: str, waiting: list[str], held: dict[str, int], turns: Turns, team: str | None
) -> None:
    assert next_team(waiting, held, SHARES, turns) == team


def test_a_turn_moves_on_by_one_over_the_share_and_three_thirds_tie_with_one() -> None:
    turns = Turns(next={"film": 1.0})
    for _ in range(3):
        turns = served(turns, "games", SHARES)
    # games' turn is 1/3 + 1/3 + 1/3, film's 1: a tie, which goes to the smaller share.
    assert next_team(["games", "film"], {}, SHARES, turns) == "film"
    assert next_team(["film", "games"], {}, SHARES, turns) == "film"


def test_with_one_place_two_waiting_teams_alternate_by_share() -> None:
    turns, order = Turns(), []
    for _ in range(12):
        team = next_team(["film", "ads"], {}, SHARES, turns)
        assert team is not None
        order.append(team)
        turns = served(turns, team, SHARES)
    assert order.count("ads") == 8 and order.count("film") == 4
    assert "filmfilm" not in "".join(order)
    # Served turns at or behind the clock are not carried: one entry per team ahead of it.
    assert set(turns.next) <= {"film", "ads"}


def pool(places: int) -> PoolBook:
    book = PoolBook(PoolInput())
    book.configure([PoolHost(ref=ref("q", "a40", places), max_jobs=places)])
    book.set_teams(SHARES, "film", {})
    return book


@pytest.mark.parametrize("places", [1, 2, 3, 5])
def test_over_random_arrivals_a_team_always_waiting_gets_its_share_of_every_window(
    places: int,
) -> None:
    """Three teams of shares 1/2/3, jobs arriving at random, every render as long as the
    others (a place frees in the order it was taken). Over every window of consecutive
    admissions during which a team always had a job waiting, it got at least its share of
    them minus one."""
    seen = [HostSeen(name="a40", reachable=True, headroom=True)]
    total = sum(SHARES.values())
    for trial in range(25):
        rng = random.Random(trial)
        # Busy (the line grows), calm (it forms and empties), or in between.
        arrivals = rng.choice([[0, 0, 0, 1, 1, 2], [0, 0, 0, 0, 0, 1], [0, 0, 1]])
        book = pool(places)
        held: list[tuple[str, datetime]] = []  # oldest first
        admitted: list[str] = []  # the team of each admission
        waited: list[set[str]] = []  # the teams with a job waiting at each admission
        n = 0
        for step in range(150):
            now = T0 + timedelta(seconds=step)
            for team in SHARES:
                for _ in range(rng.choice(arrivals)):
                    n += 1
                    ask = PoolAsk(
                        job_id=f"{team}-{n}", asked_at=now, seen=seen, team=team, priority=3
                    )
                    waiting = {book.team_of(a.team) for a in book.line} | {team}
                    for job_id, answer in book.ask(ask, now):
                        if answer.host is not None:
                            admitted.append(job_id.split("-")[0])
                            waited.append(waiting)
                            held.append((job_id, ask.asked_at))
            if len(held) == places:
                job_id, asked_at = held.pop(0)
                book.give_back(PoolLeave(job_id=job_id, asked_at=asked_at), now)
                waiting = {book.team_of(a.team) for a in book.line}
                for job_id, answer in book.admit(now, freshness=timedelta(0)):
                    admitted.append(job_id.split("-")[0])
                    waited.append(set(waiting))
                    held.append((job_id, answer.asked_at))
                    waiting = {book.team_of(a.team) for a in book.line}
        assert len(admitted) > 50
        for team, share in SHARES.items():
            for start in range(len(admitted)):
                got = 0
                for end in range(start, len(admitted)):
                    if team not in waited[end]:
                        break
                    got += admitted[end] == team
                    window = end - start + 1
                    assert got >= window * share / total - 1 - 1e-9, (
                        f"trial {trial}: {team} got {got} of {window} admissions "
                        f"from {start}: {''.join(t[0] for t in admitted[start : end + 1])}"
                    )
