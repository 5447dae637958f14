"""Preemption in the GPU pool's book (docs/gpu-line.md#preemption): which running job a waiting
job may take the place of (the rule is spillway/core/preemption.py), the order told to that
holder, and the place it lets go of kept for its preemptor. A part of `PoolBook`
(spillway/core/pool_book.py), pure and deterministic like it.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from spillway.core import preemption
from spillway.core.gpu_pool import Drain, Holder, PoolAnswer, PoolAsk, Sent
from spillway.core.pool_holders import HolderBook


class PreemptingBook(HolderBook):
    """The book's preemption; `PoolBook` holds the state and the line's helpers named here."""

    line: list[PoolAsk]
    _lined: dict[str, PoolAsk]
    drained: dict[str, Drain]
    shares: dict[str, float]
    preempt: preemption.PreemptMode
    preempt_max_run_s: float
    preemptions: int

    if TYPE_CHECKING:

        def team_of(self, team: str | None) -> str: ...
        def held_by_team(self) -> dict[str, int]: ...
        def waiting_by_team(self) -> dict[str, int]: ...
        def _held_on(self, host: str) -> list[Holder]: ...
        def _unline(self, ask: PoolAsk) -> None: ...
        def _admit(self, ask: PoolAsk, host: str, now: datetime) -> Sent: ...
        def _usable_now(self, ask: PoolAsk, now: datetime, freshness: timedelta) -> list[str]: ...
        @staticmethod
        def _can_use(ask: PoolAsk, host: str) -> bool: ...

    def _keep_promises(self, now: datetime) -> list[Sent]:
        """Each place a victim let go of, to the job that preempted it; a preemptor that left
        the line (cancelled, admitted elsewhere, gone to the cloud) leaves it to the line."""
        sent: list[Sent] = []
        for job_id, host in list(self.promised.items()):
            ask = self._lined.get(job_id)
            if ask is None or host not in self.hosts or host in self.drained:
                del self.promised[job_id]
            elif len(self._held_on(host)) < self.hosts[host].max_jobs:
                del self.promised[job_id]
                self._unline(ask)
                sent.append(self._admit(ask, host, now))
        return sent

    def _preempt(self, now: datetime, freshness: timedelta) -> list[Sent]:
        """Jobs in line that may take a running job's place (spillway/core/preemption.py),
        each told to its victim: the holder takes its prompt out of ComfyUI and gives the place
        back, which then goes to the preemptor (`promised`). Only a job that waits for any place
        preempts (one waiting for headroom may still go to the cloud), one victim each."""
        running = [
            h
            for h in self.holders.values()
            if h.clearing is None and h.preempted_by is None and h.left_at is None
            and not h.preempted and not h.adopted and self._counted_on(h) in self.hosts
        ]  # fmt: skip
        if not running:
            return []
        pending = {h.preempted_by for h in self.holders.values()} | set(self.promised)
        shares = self._standing() if self.preempt == "fair" else preemption.Shares()
        sent: list[Sent] = []
        for ask in self.line:
            if ask.mode != "any" or ask.job_id in pending:
                continue
            usable = set(self._usable_now(ask, now, freshness)) - set(self.drained)
            candidates = [
                preemption.Running(
                    job_id=h.job_id,
                    priority=h.priority,
                    team=self.team_of(h.team),
                    since=h.since,
                    rendered_s=(now - h.since).total_seconds(),
                )
                for h in running
                if h.preempted_by is None
                and self._counted_on(h) in usable
                and self._can_use(ask, self._counted_on(h))
            ]
            waiting = preemption.Waiting(ask.job_id, ask.priority, self.team_of(ask.team))
            chosen = preemption.victim(
                self.preempt, waiting, candidates, max_run_s=self.preempt_max_run_s, shares=shares
            )
            if chosen is None:
                continue
            held = self.holders[chosen.job_id]
            held.preempted_by, held.preempted_at = ask.job_id, now
            self.preemptions += 1
            order = PoolAnswer(asked_at=held.asked_at, host=held.host, preempted_by=ask.job_id)
            sent.append((held.job_id, order))
        return sent

    def _standing(self) -> preemption.Shares:
        """The teams below and above their share of the places (of the hosts not drained),
        among the teams that hold or want one."""
        held, waiting = self.held_by_team(), self.waiting_by_team()
        wanting = [t for t in {**held, **waiting} if held.get(t, 0) or waiting.get(t, 0)]
        total = sum(h.max_jobs for n, h in self.hosts.items() if n not in self.drained)
        shares = sum(self.shares.get(t, 1.0) for t in wanting)
        if not shares:
            return preemption.Shares()
        fair = {t: total * self.shares.get(t, 1.0) / shares for t in wanting}
        below = {t for t in wanting if waiting.get(t, 0) and held.get(t, 0) + 1 <= fair[t]}
        above = {t for t in wanting if held.get(t, 0) > fair[t]}
        return preemption.Shares(below=frozenset(below), above=frozenset(above))
