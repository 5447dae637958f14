"""Who a freed GPU place goes to when several teams wait (docs/design.md, "A studio of several
teams"). Pure: the pool's book (spillway/core/pool_book.py) asks it with a snapshot of who waits
and who holds what, and records each admission here.

Each team has a turn on one clock: an admission moves the team's turn on by 1/share, so over
time a team is handed places in proportion to its share. The place goes to the waiting team
whose turn comes first (the one served least recently for its share); ties go to the team of
the smallest share (losing a tie delays it by a whole 1/share, the most), then to the team
holding the fewest places now per unit of share, then to the line's order. With the smaller
share first at ties, a team always waiting gets its share of every window of admissions minus
at most one (the property test); with the line's order there, a share-1 team of three lost
that by up to 1.2 places. A team that had
nobody waiting starts again at the clock: waiting for nothing banks no places. The places held
now are a tie-break and not the first rule: with fewer places than teams, the team of share 1
holding none would otherwise take every place that frees (two places, shares 1/2/3: half the
admissions, not a sixth).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel

# Turns are sums of 1/share, compared to this many digits: 1/3 + 1/3 + 1/3 must tie with 1.
DIGITS = 6


class Turns(BaseModel):
    """What the pool carries across continue-as-new: the clock (the turn of the admission made
    last) and each team's next turn."""

    clock: float = 0.0
    next: dict[str, float] = {}


def turn(turns: Turns, team: str) -> float:
    return max(turns.next.get(team, turns.clock), turns.clock)


def next_team(
    waiting: Sequence[str],
    held: Mapping[str, int],
    shares: Mapping[str, float],
    turns: Turns,
) -> str | None:
    """The team a freed place goes to, of `waiting` (the teams with a job that can take it, in
    the order of the line's first such job). One team waiting takes every place (borrowing); a
    team not in `shares` (taken out of the teams file while its jobs wait) counts as share 1."""
    if not waiting:
        return None
    order = {team: i for i, team in enumerate(waiting)}
    return min(
        waiting,
        key=lambda t: (
            round(turn(turns, t), DIGITS),
            -1.0 / shares.get(t, 1.0),
            held.get(t, 0) / shares.get(t, 1.0),
            order[t],
        ),
    )


def served(turns: Turns, team: str, shares: Mapping[str, float]) -> Turns:
    """The turns after `team` was handed a place. A turn the clock has reached says no more
    than none (`turn`): it is dropped, so what the pool carries stays one entry per team that
    was served ahead of the others."""
    at = turn(turns, team)
    ahead = {t: v for t, v in turns.next.items() if round(v, DIGITS) > round(at, DIGITS)}
    return Turns(clock=at, next={**ahead, team: at + 1.0 / shares.get(team, 1.0)})
