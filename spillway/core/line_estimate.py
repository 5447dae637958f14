"""The GPU line's estimate (docs/gpu-line.md, "When a job in line starts"): when each waiting job
would start, from the places of the hosts it can use and the recent render times. Pure, over a
snapshot the pool's book (spillway/core/pool_book.py) takes: it shows the estimate (`spillway
queue`, `status`), tells a job waiting by its patience that it is `late`, and answers the job that
asks whether it really is before it leaves for the cloud.

Only places a job could take count: those of hosts that can run its graph, answer and are not
drained. A job ahead that can only use other hosts does not delay it; a job that no such host can
take has no estimate (None), and an unknown estimate never sends a job to the cloud.
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Waiter:
    """A job in line as the estimate sees it: the hosts whose places it could take, and how long
    it would hold one (a typical render of its shape)."""

    hosts: Collection[str]
    render_s: float


def frees_in(ran_s: float, recent: Sequence[float]) -> float:
    """When a held place frees, in seconds from now: as the recent renders that outlasted it so
    far would end (their median); one that outlasted them all, after a typical render more, so
    the estimate grows while it runs on. `recent` is never empty."""
    longer = [r - ran_s for r in recent if r > ran_s]
    return statistics.median(longer) if longer else statistics.median(recent)


def host_places(max_jobs: int, frees: Sequence[float]) -> list[float]:
    """A host's places as the line sees them: when each frees, from when its holders' places
    free (`frees`, seconds from now); the rest are free now. A host holding more than its
    `max_jobs` (lowered by a deploy) gives the line a place only once the excess have left."""
    held = sorted(frees)
    held = held[max(len(held) - max_jobs, 0) :]
    return held + [0.0] * (max_jobs - len(held))


def starts(places: Mapping[str, Sequence[float]], line: Sequence[Waiter]) -> list[float | None]:
    """Each waiter's estimated start, in seconds from now, in line order: it takes the place
    that frees first among its hosts' (`places`: per usable host, when each place frees) and
    holds it for its render. None: none of its hosts is usable."""
    return Estimate(places).extend(line)


class Estimate:
    """`starts` taken one part of the line at a time: a waiter's start depends only on those
    before it, so the estimate of a line that grew at its end goes on from where it stopped
    (the pool answers each of a burst's asks with its start: from the head each time, 2,000
    asks took 8 s of one workflow task)."""

    def __init__(self, places: Mapping[str, Sequence[float]]) -> None:
        self._frees = {host: list(when) for host, when in places.items() if when}
        for when in self._frees.values():
            heapq.heapify(when)
        self.taken: list[float | None] = []  # each waiter's start so far, in line order

    def copy(self) -> Estimate:
        other = Estimate({})
        other._frees = {host: list(when) for host, when in self._frees.items()}
        other.taken = list(self.taken)
        return other

    def extend(self, line: Sequence[Waiter]) -> list[float | None]:
        """The starts of `line`, the waiters after those taken so far; kept."""
        out: list[float | None] = []
        for waiter in line:
            options = [(self._frees[h][0], h) for h in waiter.hosts if h in self._frees]
            if not options:
                out.append(None)
                continue
            start, host = min(options)
            heapq.heapreplace(self._frees[host], start + waiter.render_s)
            out.append(round(start, 1))
        self.taken += out
        return out
