"""The holders' side of the GPU pool's book (docs/design.md, "GPU admission"): how a place comes
back. A holder not heard from is asked whether it still holds its place; a give-back in its name
frees it only once the job confirms it; a holder that ended without letting go has its prompt
taken out of ComfyUI first; a place comes back with what the line's estimate learns from it. A
part of `PoolBook` (spillway/core/pool_book.py), pure and deterministic like it.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from spillway.core.gpu_pool import MAX_SHAPES, HeldPlace, Holder, PoolHost

RECENT_HOLDS = 20  # hold durations per host the ETA is computed from
# A give-back the job still contradicts after this many holder checks is dropped: one sent by
# the job's download reaches the pool before the job itself has taken in that it let go.
LEAVE_CHECKS = 3
CHECK_NOW = datetime(2000, 1, 1, tzinfo=UTC)  # a holder's `checked_at`: check it at the next round


class HolderBook:
    """The book's holders and what it learns when a place comes back; `PoolBook` holds the
    state named here."""

    hosts: dict[str, PoolHost]
    holders: dict[str, Holder]
    holds_s: dict[str, list[float]]
    shape_holds: dict[str, list[float]]
    _at_comfyui: dict[str, str]
    promised: dict[str, str]

    def check_now(self, now: datetime, every: timedelta) -> bool:
        """A parked ask or a give-back waits for its holder's check."""
        return any(
            h.clearing is None and (h.checked_at == CHECK_NOW or self._leave_due(h, now, every))
            for h in self.holders.values()
        )

    @staticmethod
    def _leave_due(h: Holder, now: datetime, every: timedelta) -> bool:
        """A give-back no check has begun on since it came, or one the job contradicted, again
        after `every` (its download's give-back may come before the job has taken in its
        result)."""
        if h.left_at is None:
            return False
        return h.leave_unchecked or now - h.checked_at >= every

    def next_leave_check(self, every: timedelta) -> datetime | None:
        """When the next give-back is due for its check; None while none waits for one."""
        due = [
            h.checked_at if h.leave_unchecked else h.checked_at + every
            for h in self.holders.values()
            if h.clearing is None and h.left_at is not None
        ]
        return min(due) if due else None

    def unheard(self, now: datetime, after: timedelta, every: timedelta) -> list[Holder]:
        """The holders to check now: not heard from for `after`, or whose give-back is due for
        its check (one whose prompt is being taken out is not asked again). Their give-backs
        count as under check from here: one that comes later is checked again."""
        due = [
            h
            for h in self.holders.values()
            if h.clearing is None
            and (now - h.checked_at >= after or self._leave_due(h, now, every))
        ]
        for h in due:
            h.leave_unchecked = False
        return due

    def heard(self, job_id: str, at: datetime) -> None:
        """The holder was checked at `at` (when the check began) and said it holds its place,
        or could not be asked: a give-back in its name that came by then is dropped once that
        has happened LEAVE_CHECKS times (the place stays held; the holder check goes on)."""
        held = self.holders.get(job_id)
        if held is None:
            return
        held.checked_at = max(held.checked_at, at)
        if held.left_at is not None and not held.leave_unchecked:
            held.left_checks += 1
            if held.left_checks >= LEAVE_CHECKS:
                held.left_at, held.left_prompt, held.left_checks = None, None, 0
                held.left_render_s = None

    def adopt(
        self,
        job_id: str,
        asked_at: datetime,
        host: str,
        now: datetime,
        run_id: str | None = None,
        *,
        check_now: bool = False,
        team: str | None = None,
    ) -> None:
        """A place a job holds from an earlier pool: counted as held until it is given back.
        `check_now`: the job is asked at the next holder check whether it still holds it."""
        if job_id not in self.holders:
            self.holders[job_id] = Holder(
                job_id=job_id,
                asked_at=asked_at,
                host=host,
                since=now,
                checked_at=CHECK_NOW if check_now else now,
                run_id=run_id,
                adopted=True,
                comfyui=self.hosts[host].ref.comfyui if host in self.hosts else None,
                team=team,
            )

    def held_places(self) -> dict[str, HeldPlace]:
        """Who holds which place (the pool's memo): a place being cleared is no job's now."""
        return {
            h.job_id: HeldPlace(asked_at=h.asked_at, host=h.host, run_id=h.run_id)
            for h in self.holders.values()
            if h.clearing is None
        }

    def free(
        self,
        holder: Holder,
        now: datetime,
        prompt_id: str | None = None,
        *,
        whole_run: bool = False,
    ) -> bool:
        """A holder that is gone (left, terminated, reset away), as the holder check found:
        its place back to the pool, once `prompt_id` (one ComfyUI may still hold) is out, or
        with `whole_run`, every prompt of `prompt_id`'s run."""
        held = self.holders.get(holder.job_id)
        if held is None or held.asked_at != holder.asked_at or held.clearing is not None:
            return False
        # It gave its place back before it ended: a render, which the ETA learns from.
        timed = held.left_at is not None and not whole_run
        return self._leave(held, prompt_id, now, whole_run=whole_run, timed=timed)

    def _leave(
        self,
        held: Holder,
        prompt_id: str | None,
        now: datetime,
        *,
        whole_run: bool = False,
        timed: bool = False,
    ) -> bool:
        """`timed`: the job left after its render, which the ETA learns from."""
        if prompt_id is not None:
            held.clearing, held.clearing_run = prompt_id, whole_run
            return False
        self._release(held, now, timed=timed)
        return True

    def to_clear(self, now: datetime, every: timedelta) -> list[Holder]:
        """Left places whose prompt is to be taken out now (first try, or `every` since)."""
        return [
            h
            for h in self.holders.values()
            if h.clearing is not None and (h.cleared_at is None or now - h.cleared_at >= every)
        ]

    def next_clear(self, now: datetime, every: timedelta) -> datetime | None:
        """When `to_clear` will next name a place; None while no place is left uncleared."""
        due = [
            now if h.cleared_at is None else h.cleared_at + every
            for h in self.holders.values()
            if h.clearing is not None
        ]
        return min(due) if due else None

    def cleared(self, holder: Holder, now: datetime) -> bool:
        """The prompt is out of ComfyUI: the place is free."""
        held = self.holders.get(holder.job_id)
        if held is None or held.asked_at != holder.asked_at:
            return False
        self._release(held, now)
        return True

    def _release(self, held: Holder, now: datetime, *, timed: bool = False) -> None:
        """A place back. What the ETA learns, from a job that gave its place back itself: its
        render as ComfyUI timed it, else how long it held the place (not known for a hold
        adopted from an earlier pool). Never from a job that ended without giving it back, or a
        prompt taken out: those are no renders. (A spillway stopped 17 minutes mid-render made
        one "17 minutes", and every wait behind two 8 s renders "~9 min".)"""
        del self.holders[held.job_id]
        if held.preempted_by is not None:
            # Let go of for its preemptor. An interrupted render teaches the ETA nothing; one
            # that ended before the job let go comes with its time.
            self.promised[held.preempted_by] = self._counted_on(held)
            timed = timed and held.left_render_s is not None
        took = held.left_render_s if timed else None
        if took is None and timed and not held.adopted:
            took = (now - held.since).total_seconds()
        if took is not None:
            holds = self.holds_s.setdefault(self._counted_on(held), [])
            holds.append(took)
            del holds[:-RECENT_HOLDS]
        if took is not None and held.shape is not None:
            # Renewed last at the end: the shapes seen least recently go first.
            shaped = self.shape_holds.pop(held.shape, [])
            self.shape_holds[held.shape] = [*shaped, took][-RECENT_HOLDS:]
            for old in list(self.shape_holds)[:-MAX_SHAPES]:
                del self.shape_holds[old]

    def _counted_on(self, held: Holder) -> str:
        """The host whose places `held` takes: the one it was admitted to, or, that name no
        longer configured, the host at the same ComfyUI (renamed: a new name is not a new card).
        A loopback URL shared by hosts on their own machines names none of them."""
        if held.host in self.hosts or held.comfyui is None:
            return held.host
        return self._at_comfyui.get(held.comfyui, held.host)

    def host_of(self, held: Holder) -> PoolHost | None:
        """The configured host `held` counts on; None: none (its place counts nowhere)."""
        return self.hosts.get(self._counted_on(held))
