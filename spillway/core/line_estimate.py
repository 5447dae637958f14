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
    frees = {host: list(when) for host, when in places.items() if when}
    for when in frees.values():
        heapq.heapify(when)
    out: list[float | None] = []
    for waiter in line:
        options = sorted((frees[h][0], h) for h in waiter.hosts if h in frees)
        if not options:
            out.append(None)
            continue
        start, host = options[0]
        heapq.heapreplace(frees[host], start + waiter.render_s)
        out.append(round(start, 1))
    return out
