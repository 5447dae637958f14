"""The GPU line's estimate in the pool's book (docs/gpu-line.md, "When a job in line starts"):
each waiting job's estimated start from the places of the hosts it can use and the recent
renders (the rule is spillway/core/line_estimate.py), kept between answers while only the line's
tail changes, and whether a job waiting by its patience is late by it. A part of `PoolBook`
(spillway/core/pool_book.py), pure and deterministic like it.
"""

from __future__ import annotations

import bisect
import operator
import statistics
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from spillway.core.gpu_pool import LateCheck, PoolAnswer, PoolAsk, Sent
from spillway.core.line_estimate import Estimate, Waiter, frees_in, host_places
from spillway.core.pool_preempting import PreemptingBook


@dataclass
class _KeptEstimate:
    """The line's estimate as far as it was taken: valid for its key (the time, the places and
    the recent renders) while the line begins with `asks`, the very same objects (an ask changed
    is a new object)."""

    key: tuple[Any, ...]
    estimate: Estimate
    asks: list[PoolAsk] = field(default_factory=list)

    def heads(self, line: list[PoolAsk]) -> bool:
        n = len(self.asks)
        return len(line) >= n and all(map(operator.is_, line[:n], self.asks))


class EstimatingBook(PreemptingBook):
    """The book's estimate and patience; `PoolBook` holds the state and the helpers named here."""

    _kept: _KeptEstimate | None

    if TYPE_CHECKING:

        def _key(self, ask: PoolAsk) -> tuple[Any, ...]: ...
        def _reachable(self, host: str) -> bool: ...

    def late(self, now: datetime) -> list[Sent]:
        """Each job waiting by its patience whose estimated start has passed it, told once
        (`late`, its position and estimate): it leaves the line for the cloud."""
        patient = self._patient()
        if not patient:
            return []
        etas = self._line_etas(now, patient[-1] + 1)
        sent: list[Sent] = []
        for i in patient:
            ask = self.line[i]
            if self._late(ask, etas[i], now):
                ask.told_late = True
                answer = PoolAnswer(
                    asked_at=ask.asked_at,
                    position=i + 1,
                    eta_s=etas[i],
                    render_s=self._typical(ask.shape),
                    late=True,
                )
                sent.append((ask.job_id, answer))
        return sent

    def next_late(self, now: datetime) -> datetime | None:
        """When an estimate may next pass a patience: a job's estimated start grows at most as
        fast as time passes, but for a jump when a held place outlasts one more of the recent
        renders (its end is then estimated from the longer ones)."""
        patient = self._patient()
        if not patient or not self._holds():
            return None
        etas = self._line_etas(now, patient[-1] + 1)
        due: list[datetime] = []
        for i in patient:
            ask, eta = self.line[i], etas[i]
            if ask.start_by is not None and eta is not None:
                before = (self._typical(ask.shape) or 0.0) if ask.by_deadline else 0.0
                due.append(max(ask.start_by - timedelta(seconds=eta + before), now))
        for held in self.holders.values():
            ran = (now - held.since).total_seconds()
            longer = [r for r in self._holds(held.shape) if r > ran]
            if longer and held.clearing is None:
                due.append(held.since + timedelta(seconds=min(longer)))
        return min(due) if due else None

    def confirm_late(self, ask: PoolAsk, now: datetime) -> LateCheck:
        """Whether `ask`, as the job itself keeps it (its ask time, its own patience, priority,
        hosts and shape), is late by the line's estimate now. The job leaves for the cloud only
        on this: an answer saying `late` may be anyone's signal, and the line may hold the job's
        ask as a message in its name changed it. Not late: an ask this pool does not have in
        line (the job's line check gives it back), or an estimate not known."""
        lined = self._lined.get(ask.job_id)
        if lined is None or lined.asked_at != ask.asked_at:
            return LateCheck()
        others = [a for a in self.line if a.job_id != ask.job_id]
        position = bisect.bisect_left(others, self._key(ask), key=self._key) + 1
        eta = self._etas(now, [*others[: position - 1], ask])[-1]
        late = self._late(ask, eta, now)
        return LateCheck(lined=True, position=position, eta_s=eta, late=late)

    def _patient(self) -> list[int]:
        return [i for i, a in enumerate(self.line) if a.start_by is not None and not a.told_late]

    def _late(self, ask: PoolAsk, eta: float | None, now: datetime) -> bool:
        if ask.start_by is None or eta is None:
            return False
        before = (self._typical(ask.shape) or 0.0) if ask.by_deadline else 0.0
        return now + timedelta(seconds=eta + before) > ask.start_by

    def _etas(self, now: datetime, asks: list[PoolAsk]) -> list[float | None]:
        """The estimated start of each of `asks` (the line's order, from its head), in seconds
        from `now` (spillway/core/line_estimate.py): only the places of hosts that answer and
        are not drained count, and each job only those of the hosts it can use. A held place
        frees as the recent renders of its shape that outlasted it would end; one being cleared
        frees now. None for each before any render was seen."""
        if not self._holds():
            return [None] * len(asks)
        return Estimate(self._places(now)).extend(self._waiters(asks))

    def _line_etas(self, now: datetime, upto: int) -> list[float | None]:
        """`_etas` of the line's first `upto` jobs. Kept between calls while the places, the
        recent renders and the line before its tail stay as they were: a burst of asks lined at
        the end is answered in time linear in the line, not quadratic."""
        return self._line_estimate(now, upto).taken[:upto]

    def _eta_behind(self, now: datetime, upto: int, ask: PoolAsk) -> float | None:
        """`ask`'s estimated start were it behind the line's first `upto` jobs."""
        if not self._holds():
            return None
        estimate = self._line_estimate(now, upto)
        if self._kept is None or len(self._kept.asks) != upto:  # taken beyond: from the head
            return self._etas(now, [*self.line[:upto], ask])[-1]
        return estimate.copy().extend(self._waiters([ask]))[-1]

    def _line_estimate(self, now: datetime, upto: int) -> Estimate:
        if not self._holds():
            estimate = Estimate({})
            estimate.taken = [None] * upto
            return estimate
        places = self._places(now)
        key = (
            now,
            tuple((n, tuple(p)) for n, p in places.items()),
            tuple((n, tuple(v)) for n, v in self.holds_s.items()),
            tuple((n, tuple(v)) for n, v in self.shape_holds.items()),
        )
        kept = self._kept
        if kept is None or kept.key != key or not kept.heads(self.line):
            kept = self._kept = _KeptEstimate(key, Estimate(places))
        if upto > len(kept.asks):
            more = self.line[len(kept.asks) : upto]
            kept.estimate.extend(self._waiters(more))
            kept.asks += more
        return kept.estimate

    def _places(self, now: datetime) -> dict[str, list[float]]:
        return {
            name: host_places(
                host.max_jobs,
                [
                    0.0
                    if held.clearing is not None
                    else frees_in((now - held.since).total_seconds(), self._holds(held.shape))
                    for held in self._held_on(name)
                ],
            )
            for name, host in self.hosts.items()
            if name not in self.drained and self._reachable(name)
        }

    def _waiters(self, asks: list[PoolAsk]) -> list[Waiter]:
        typical: dict[str | None, float] = {}
        waiters = []
        for ask in asks:
            if ask.shape not in typical:
                typical[ask.shape] = statistics.median(self._holds(ask.shape))
            hosts = [n for n in self.hosts if self._can_use(ask, n)]
            waiters.append(Waiter(hosts=hosts, render_s=typical[ask.shape]))
        return waiters

    def _holds(self, shape: str | None = None) -> list[float]:
        """The recent renders of `shape` where the pool has seen some, else of every shape."""
        if shape is not None and self.shape_holds.get(shape):
            return self.shape_holds[shape]
        return [s for v in self.holds_s.values() for s in v]

    def _typical(self, shape: str | None = None) -> float | None:
        """The median of the recent renders (of `shape` where known): one that ran an hour does
        not make every wait an hour."""
        holds = self._holds(shape)
        return statistics.median(holds) if holds else None
