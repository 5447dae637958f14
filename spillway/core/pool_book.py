"""The GPU pool's book (docs/design.md, "GPU admission"): every host's places, who holds them, the
line of jobs waiting for one, and what the pool last knew of each host. Pure and deterministic:
the pool workflow (workflows/gpu_pool.py) is its one owner and applies the jobs' messages
(spillway/core/gpu_pool.py) to it one at a time, so a place is never counted in one place and taken
in another.
"""

from __future__ import annotations

import bisect
from datetime import datetime, timedelta
from typing import Any

from spillway.core import fair_share, preemption
from spillway.core.gpu_pool import (
    Drain,
    Holder,
    HostPlaces,
    HostSeen,
    InLine,
    Message,
    PlaceView,
    PoolAnswer,
    PoolAsk,
    PoolDrain,
    PoolHost,
    PoolInput,
    PoolLeave,
    PoolView,
    Quoted,
    Reading,
    Sent,
)
from spillway.core.models import HostCapabilities, HostRef, JobPlace, QueueSpot
from spillway.core.models import PlaceMode as Mode
from spillway.core.pool_estimate import EstimatingBook
from spillway.core.pool_holders import CHECK_NOW
from spillway.core.teams import STUDIO, over_waiting

# A job in line is passed by a job whose models are warm on a freed place's host at most this
# many times (SPILLWAY_POOL_PREFER_WARM); then it takes the next place it can use.
WARM_PASSES = 2
HEADROOM_WHY = "approval, or a host with headroom"


def full_reason(host: str, taken: int, max_jobs: int) -> str:
    return f"gpu_places_full_{host}_{taken}of{max_jobs}"


class PoolBook(EstimatingBook):
    def __init__(self, inp: PoolInput) -> None:
        self.hosts: dict[str, PoolHost] = {}
        self._at_comfyui: dict[str, str] = {}  # the host at each ComfyUI only one host is at
        self.holders: dict[str, Holder] = {h.job_id: h for h in inp.holders}
        # Aging (SPILLWAY_POOL_AGING_S): a waiting job's priority rises one step per `aging`,
        # which orders the line by ask time plus `aging` per step below priority 1; None: by
        # priority, then ask time (pools of 0.5.0).
        self.aging: timedelta | None = None
        self.line: list[PoolAsk] = sorted(inp.line, key=self._key)
        self._lined = {a.job_id: a for a in self.line}
        self.readings = dict(inp.readings)
        self.holds_s = {name: list(v) for name, v in inp.holds_s.items()}
        self.shape_holds = {shape: list(v) for shape, v in inp.shape_holds.items()}
        self.parked: dict[str, PoolAsk] = {a.job_id: a for a in inp.parked}
        # A give-back frees a place only once the job confirms it (pools of 0.5.0 took it on
        # its word: anyone with signal rights could free a place that was still rendering).
        self.verify_leaves = False
        # Per host, the models of the job admitted there last: with `prefer_warm`, a job whose
        # models these are takes that host first, and may go ahead of its own priority's jobs.
        self.warm = {name: list(v) for name, v in inp.warm.items()}
        self.prefer_warm = False
        self.capabilities = dict(inp.capabilities)
        self.drained = dict(inp.drained)
        # Asks that would change a lined job's mode or priority, until its own place confirms
        # them (`changes_confirmed`); pools of 0.6.0 took them on the message's word.
        self.changing = {a.job_id: a for a in inp.changing}
        self.confirm_changes = False
        # The teams (the workers' policy): a freed place goes by their shares
        # (spillway/core/fair_share.py); a job of no team is the default team's.
        self.shares: dict[str, float] = {}
        self.default_team = STUDIO
        self.max_waiting: dict[str, int] = {}
        self.turns = inp.turns
        # Preemption (SPILLWAY_PREEMPT; spillway/core/preemption.py): who may take whose place,
        # and the places let go of for a preemptor, kept for it (`promised`).
        self.preempt: preemption.PreemptMode = "off"
        self.preempt_max_run_s = 120.0
        self.promised = dict(inp.promised)
        self.preemptions = inp.preemptions
        self._kept = None  # the line's estimate so far (`_line_estimate`)
        if inp.hosts:
            self.configure(inp.hosts)

    def set_aging(self, aging: timedelta | None) -> None:
        if aging != self.aging:
            self.aging = aging
            self.line.sort(key=self._key)

    def set_teams(
        self, shares: dict[str, float], default: str, max_waiting: dict[str, int]
    ) -> None:
        self.shares, self.default_team = dict(shares), default
        self.max_waiting = dict(max_waiting)

    def team_of(self, team: str | None) -> str:
        """A job's team in the line; one the teams file does not name (a job from before the
        file, `studio`) counts as the default team's, as the guide says."""
        return team if team is not None and team in self.shares else self.default_team

    def held_by_team(self) -> dict[str, int]:
        """Places held per team; a place being cleared is no team's now."""
        held = dict.fromkeys(self.shares, 0)
        for h in self.holders.values():
            if h.clearing is None:
                team = self.team_of(h.team)
                held[team] = held.get(team, 0) + 1
        return held

    def waiting_by_team(self) -> dict[str, int]:
        waiting = dict.fromkeys(self.shares, 0)
        for a in self.line:
            team = self.team_of(a.team)
            waiting[team] = waiting.get(team, 0) + 1
        return waiting

    def _team_places(self, ask: PoolAsk) -> int | None:
        """What a waiting job is told of its team's places: only where there are teams."""
        if len(self.shares) < 2:
            return None
        return self.held_by_team().get(self.team_of(ask.team), 0)

    def _key(self, ask: PoolAsk) -> tuple[Any, ...]:
        """The line's order. With aging, a job that asked `aging` earlier than one a priority
        step ahead of it goes first: the order never changes as time passes, only as jobs ask."""
        if self.aging is None:
            return ask.priority, ask.asked_at, ask.job_id
        return ask.asked_at + (ask.priority - 1) * self.aging, ask.priority, ask.job_id

    def configure(self, hosts: list[PoolHost]) -> None:
        """The hosts in force (the workers' policy). Holders of a host no longer configured keep
        their place until they give it back, counted on the host at its ComfyUI where one is (it
        was renamed: `_counted_on`); what was known of it goes."""
        self.hosts = {h.ref.name: h for h in hosts}
        comfyuis = [h.ref.comfyui for h in hosts if h.ref.comfyui is not None]
        self._at_comfyui = {
            h.ref.comfyui: h.ref.name
            for h in hosts
            if h.ref.comfyui is not None and comfyuis.count(h.ref.comfyui) == 1
        }
        self.readings = {n: r for n, r in self.readings.items() if n in self.hosts}
        self.holds_s = {n: v for n, v in self.holds_s.items() if n in self.hosts}
        self.warm = {n: v for n, v in self.warm.items() if n in self.hosts}
        self.capabilities = {n: c for n, c in self.capabilities.items() if n in self.hosts}

    # --- what jobs say ---------------------------------------------------------------------

    def ask(self, ask: PoolAsk, now: datetime) -> list[Sent]:
        for seen in ask.seen:
            self._note(seen.name, Reading(reachable=seen.reachable, headroom=seen.headroom, at=now))
            self._note_capabilities(seen.name, seen.capabilities)
        held = self.holders.get(ask.job_id)
        if held is not None:
            if held.preempted_by is not None and ask.preempted_by is not None:
                # A preempted job lets go of its place, then asks again with the same ask time:
                # lined once the holder check confirms the place is free (never on its word).
                self.parked[ask.job_id] = ask.model_copy(update={"seen": []})
                held.checked_at = CHECK_NOW
                return []
            if held.asked_at == ask.asked_at:  # asked again (its answer may be lost): the same
                return [(ask.job_id, PoolAnswer(asked_at=ask.asked_at, host=held.host))]
            # A run reset to before its ask asks anew, and so does anyone who names the job:
            # the ask waits, unanswered, until the job itself says it no longer holds its place
            # (the holder check, asked for now), never freeing it on a message's word.
            self.parked[ask.job_id] = ask.model_copy(update={"seen": []})
            held.checked_at = CHECK_NOW
            return []
        lined = self._in_line(ask.job_id)
        if lined is not None and ask.again and lined.asked_at == ask.asked_at:
            lined.run_id = ask.run_id or lined.run_id  # a run continued as new asks now
            return []  # it is where it was
        if lined is not None and self.confirm_changes:
            same = lined.asked_at == ask.asked_at
            if same and (ask.mode, ask.priority) == (lined.mode, lined.priority):
                return [(ask.job_id, self._lined_answer(lined, now))]  # unanswered, it asked again
            # Anyone may send an ask in the job's name: another mode or priority, or another ask
            # time (a run reset to before its ask asks anew), waits for the job's own word.
            self.changing[ask.job_id] = ask.model_copy(update={"seen": []})
            return []
        if lined is not None:
            self._unline(lined)
            if lined.asked_at == ask.asked_at:  # a changed mode; its position is kept
                # And its patience: one ask of a job has one, and a message in its name that
                # named another could make the pool call it late.
                kept = {"start_by": lined.start_by, "by_deadline": lined.by_deadline}
                ask = ask.model_copy(update={"wait": True, "passed": lined.passed, **kept})
        elif ask.start_by is not None and ask.start_by <= now:
            # A patience already over when it asks is no job's (a job past its own overflows
            # without asking to wait): believed, it would make the pool say `late` at once.
            ask = ask.model_copy(update={"start_by": None, "by_deadline": False})
        # A job already waiting (its mode changed, or a pool that lost it lines it again, or
        # preemption sent it back) is never turned away by its team's limit.
        limited = lined is None and not ask.again and ask.preempted_by is None
        return self._line_or_admit(ask, now, limited=limited)

    def _line_or_admit(self, ask: PoolAsk, now: datetime, *, limited: bool = False) -> list[Sent]:
        host = self._place_for(ask, [s.name for s in ask.seen if self._usable(s, ask.mode)])
        if host is not None:
            return [self._admit(ask, host, now)]
        full = self.full_reasons(ask)
        refused = self._over_limit(ask) if limited and ask.wait else None
        if refused is not None:
            return [(ask.job_id, PoolAnswer(asked_at=ask.asked_at, full=full, refused=refused))]
        if not ask.wait:
            would_be = bisect.bisect_left(self.line, self._key(ask), key=self._key) + 1
            answer = PoolAnswer(
                asked_at=ask.asked_at,
                full=full,
                would_be=would_be,
                eta_s=self._eta_behind(now, would_be - 1, ask),
            )
            return [(ask.job_id, answer)]
        # What the line carries across continue-as-new stays small: the probe it came with has
        # been noted by `ask`.
        ask = ask.model_copy(update={"seen": [], "again": False})
        position = bisect.bisect_left(self.line, self._key(ask), key=self._key) + 1
        self.line.insert(position - 1, ask)
        self._lined[ask.job_id] = ask
        eta = self._line_etas(now, position)[-1]
        ask.told_late = self._late(ask, eta, now)
        in_line = PoolAnswer(
            asked_at=ask.asked_at,
            position=position,
            full=full,
            eta_s=eta,
            render_s=self._typical(ask.shape),
            late=ask.told_late,
            team_places=self._team_places(ask),
        )
        return [(ask.job_id, in_line), *self.admit(now, freshness=timedelta(0))]

    def _over_limit(self, ask: PoolAsk) -> str | None:
        """The refusal of a job whose team has `max_waiting` jobs in line already."""
        team = self.team_of(ask.team)
        limit = self.max_waiting.get(team)
        if limit is None or self.waiting_by_team().get(team, 0) < limit:
            return None
        return over_waiting(team, limit)

    def _lined_answer(self, ask: PoolAsk, now: datetime) -> PoolAnswer:
        i = bisect.bisect_left(self.line, self._key(ask), key=self._key)
        return PoolAnswer(
            asked_at=ask.asked_at,
            position=i + 1,
            full=self.full_reasons(ask),
            eta_s=self._line_etas(now, i + 1)[-1],
            render_s=self._typical(ask.shape),
            late=ask.told_late,
            team_places=self._team_places(ask),
        )

    def changes_confirmed(
        self, places: dict[str, JobPlace | None], now: datetime
    ) -> tuple[list[Sent], list[str]]:
        """The pending changes (`changing`) against each job's own place, as its `place` query
        answered (None: it holds no ask, or could not be asked). A change the job's place shows
        is applied: the same ask moves to its new priority, or waits in its new mode, and keeps
        its patience, hosts and shape; a new ask (its place shows that ask time) takes the
        line's, as the job's place has it. Any other is dropped (a job that asked it asks again,
        unanswered). Returns the answers and the jobs whose change was dropped."""
        sent: list[Sent] = []
        dropped: list[str] = []
        for job_id, ask in list(self.changing.items()):
            del self.changing[job_id]
            lined = self._lined.get(job_id)
            if lined is None:
                continue  # it left the line meanwhile
            place = places.get(job_id)
            if (
                place is None
                or place.asked_at != ask.asked_at
                or (place.mode, place.priority) != (ask.mode, ask.priority)
            ):
                dropped.append(job_id)
                continue
            self._unline(lined)
            if lined.asked_at == ask.asked_at:
                kept = {"mode": place.mode, "priority": place.priority}
                sent += self._line_or_admit(lined.model_copy(update=kept), now)
                continue
            own = place.model_dump(include={"unfit", "models", "start_by", "by_deadline", "team"})
            anew = ask.model_copy(update={**own, "mode": place.mode, "priority": place.priority})
            if anew.start_by is not None and anew.start_by <= now:
                anew = anew.model_copy(update={"start_by": None, "by_deadline": False})
            sent += self._line_or_admit(anew, now)
        return sent, dropped

    def give_back(self, leave: PoolLeave, now: datetime) -> bool:
        """True when it changed something (a place freed or the line shortened). A holder's
        give-back waits for the holder check (`verify_leaves`); leaving the line does not: a job
        taken out of the line in its name asks again with its first ask time at its next line
        check."""
        held = self.holders.get(leave.job_id)
        if held is not None and held.asked_at == leave.asked_at:
            if held.clearing is not None:  # free only once `cleared` says so
                return False
            if self.verify_leaves:
                held.left_at, held.left_prompt, held.left_checks = now, leave.prompt_id, 0
                held.leave_unchecked, held.left_render_s = True, leave.render_s
                return False
            held.left_render_s = leave.render_s
            return self._leave(held, leave.prompt_id, now, timed=True)
        lined = self._in_line(leave.job_id)
        if lined is not None and lined.asked_at == leave.asked_at:
            self._unline(lined)
            return True
        return False

    def drain(self, drain: PoolDrain, now: datetime) -> bool:
        """A host drained (no new places; those held finish) or resumed. True when it resumed:
        its free places go to the line. A host the workers do not have is left alone (the CLI
        names the hosts it can drain)."""
        if drain.host not in self.hosts:
            return False
        if not drain.drain:
            return self.drained.pop(drain.host, None) is not None
        known = self.drained.get(drain.host)
        since = known.since if known else now
        self.drained[drain.host] = Drain(by=drain.by, since=since, reason=drain.reason)
        return False

    def places_differ(self, places: dict[str, int]) -> bool:
        return bool(places) and places != {n: h.max_jobs for n, h in self.hosts.items()}

    def note_probe(self, host: str, reading: Reading) -> None:
        self._note(host, reading)

    # --- handing out places ----------------------------------------------------------------

    def admit(self, now: datetime, freshness: timedelta) -> list[Sent]:
        """Free places to the line: each to the first job that can take it of the team whose
        turn it is (`_next_turn`). A job that waits for headroom takes a place only on a host
        whose reading is at most `freshness` old and shows headroom. A job of the same team
        behind the one whose turn it is may take the place instead when its models are warm on
        that host and the other's are not (`_warm_instead`)."""
        sent = self._keep_promises(now)
        while self._free_hosts():
            turn = self._next_turn(now, freshness)
            if turn is None:
                break
            ask, host = turn
            ask = self._warm_instead(ask, host, now, freshness) or ask
            self._unline(ask)
            sent.append(self._admit(ask, host, now))
        if self.preempt != "off" and self.line:
            sent += self._preempt(now, freshness)
        return sent

    def _next_turn(self, now: datetime, freshness: timedelta) -> tuple[PoolAsk, str] | None:
        """Of each team's first job in line that can take a free place, the one of the team
        whose turn it is (spillway/core/fair_share.py), with the host it takes. With one team
        that is the line's first job that can: the line as it always was."""
        teams = {self.team_of(a.team) for a in self.line}
        first: dict[str, tuple[PoolAsk, str]] = {}
        for ask in self.line:
            team = self.team_of(ask.team)
            if team in first:
                continue
            host = self._place_for(ask, self._usable_now(ask, now, freshness))
            if host is not None:
                first[team] = (ask, host)
                if len(first) == len(teams):
                    break
        chosen = fair_share.next_team(list(first), self.held_by_team(), self.shares, self.turns)
        return None if chosen is None else first[chosen]

    def _usable_now(self, ask: PoolAsk, now: datetime, freshness: timedelta) -> list[str]:
        return [
            name
            for name, r in self.readings.items()
            if r.reachable and (ask.mode == "any" or (r.headroom and now - r.at <= freshness))
        ]

    def _warm_instead(
        self, turn: PoolAsk, host: str, now: datetime, freshness: timedelta
    ) -> PoolAsk | None:
        """The first job behind `turn`, of the same priority, whose models are warm on `host`
        where `turn`'s are not; every job it passes (those that could take the place) counts
        the pass, and none is passed more than WARM_PASSES times. None: `turn` goes."""
        if not self.prefer_warm or self._warm(turn, host):
            return None
        passed = [turn]
        for ask in self.line[self.line.index(turn) + 1 :]:
            if host not in self._usable_now(ask, now, freshness) or not self._can_use(ask, host):
                continue  # it could not take this place: nobody passes it here
            if self.team_of(ask.team) != self.team_of(turn.team):
                continue  # warm models never take a place from another team's turn
            if ask.priority != turn.priority or any(p.passed >= WARM_PASSES for p in passed):
                return None
            if self._warm(ask, host):
                for p in passed:
                    p.passed += 1
                return ask
            passed.append(ask)
        return None

    def _warm(self, ask: PoolAsk, host: str) -> bool:
        return bool(ask.models) and set(ask.models) <= set(self.warm.get(host, ()))

    def to_probe(self, now: datetime, every: timedelta) -> list[HostRef]:
        """The hosts worth probing now: someone waits, the host has a free place, and what the
        pool knows of it is older than `every` (it may have headroom, or answer, again)."""
        if not self.line:
            return []
        due = []
        for name in self._wanted(self._free_hosts()):
            reading = self.readings.get(name)
            if reading is None or now - reading.at >= every:
                due.append(self.hosts[name].ref)
        return due

    def next_probe(self, now: datetime, every: timedelta) -> datetime | None:
        """When `to_probe` will next name a host; None while it names none (nobody waits, or
        no host has a free place)."""
        if not self.line:
            return None
        due = [
            reading.at + every if (reading := self.readings.get(name)) else now
            for name in self._wanted(self._free_hosts())
        ]
        return min(due) if due else None

    def settle_parked(self, still_holding: set[str], now: datetime) -> list[Sent]:
        """After a holder check: a parked ask of a job whose earlier place is free now is asked
        (it comes after everyone already waiting, as any new ask); one whose job still holds
        its place was not the job's (dropped); the rest wait for the next check."""
        sent: list[Sent] = []
        for job_id, ask in list(self.parked.items()):
            if job_id in still_holding:
                del self.parked[job_id]
            elif job_id not in self.holders:
                del self.parked[job_id]
                sent += self.admit(now, freshness=timedelta(0))  # its old place: the line's
                sent += self.ask(ask, now)
        return sent

    # --- patience --------------------------------------------------------------------------

    # --- what people see -------------------------------------------------------------------

    def quote(self, ask: PoolAsk, now: datetime) -> Quoted:
        """Where `ask` would stand if it came now; nothing changes."""
        host = self._place_for(ask, [s.name for s in ask.seen if self._usable(s, ask.mode)])
        if host is not None:
            return Quoted(host=host, eta_s=0.0)
        position = bisect.bisect_left(self.line, self._key(ask), key=self._key) + 1
        return Quoted(
            position=position,
            eta_s=self._eta_behind(now, position - 1, ask),
            full=self.full_reasons(ask),
            render_s=self._typical(ask.shape),
        )

    def spot(self, job_id: str, now: datetime) -> QueueSpot | None:
        ask = self._lined.get(job_id)
        if ask is None:
            return None
        i = bisect.bisect_left(self.line, self._key(ask), key=self._key)
        return QueueSpot(
            position=i + 1,
            ahead=i,
            eta_s=self._line_etas(now, i + 1)[-1],
            waits_for=HEADROOM_WHY if ask.mode == "headroom" else self._waits_for(ask),
            team_places=self._team_places(ask),
        )

    def view(self, now: datetime, head: int | None = None) -> PoolView:
        """Every host's places and the line (its first `head` only, when given)."""
        hosts = []
        for name in sorted(set(self.hosts) | {self._counted_on(h) for h in self.holders.values()}):
            reading = self.readings.get(name)
            places = sorted(
                (
                    PlaceView(
                        job_id=h.job_id,
                        since=h.since,
                        clearing=h.clearing,
                        team=self.team_of(h.team),
                        preempted_by=h.preempted_by,
                    )
                    for h in self._held_on(name)
                ),
                key=lambda p: p.since,
            )
            hosts.append(
                HostPlaces(
                    name=name,
                    max_jobs=self.hosts[name].max_jobs if name in self.hosts else 0,
                    places=places,
                    reachable=reading.reachable if reading else None,
                    headroom=reading.headroom if reading else None,
                    capabilities=self.capabilities.get(name),
                    drained=self.drained.get(name),
                    warm=self.warm.get(name, []),
                )
            )
        shown = self.line[:head]
        etas = self._line_etas(now, len(shown))
        line = [
            InLine(
                job_id=a.job_id,
                priority=a.priority,
                since=a.asked_at,
                mode=a.mode,
                position=i + 1,
                eta_s=etas[i],
                state="awaiting_approval" if a.mode == "headroom" else "queued",
                why=HEADROOM_WHY if a.mode == "headroom" else self._waits_for(a),
                team=self.team_of(a.team),
                preempted_by=a.preempted_by,
            )
            for i, a in enumerate(shown)
        ]
        return PoolView(hosts=hosts, line=line, preemptions=self.preemptions)

    def _waits_for(self, ask: PoolAsk) -> str:
        """Why a job that takes any free place waits: no host (of those that can run it)
        answers, or every place of those that answer is taken (then the jobs ahead of it take the
        next ones)."""
        mine = [n for n in self.hosts if self._can_use(ask, n)]
        drained = [
            f"host {n} drained by {d.by}" + (f": {d.reason}" if d.reason else "")
            for n in mine
            if (d := self.drained.get(n)) is not None
        ]
        answering = [n for n in mine if self._reachable(n) and n not in self.drained]
        if not answering:
            return "; ".join(drained) or "no GPU host answers"
        counts = self.in_use()
        taken = ", ".join(f"{n} {counts[n]}/{self.hosts[n].max_jobs}" for n in answering)
        return "; ".join([f"places taken ({taken})", *drained])

    def _reachable(self, host: str) -> bool:
        reading = self.readings.get(host)
        return reading is None or reading.reachable

    def in_use(self) -> dict[str, int]:
        return {name: len(self._held_on(name)) for name in self.hosts}

    def full_reasons(self, ask: PoolAsk | None = None) -> list[str]:
        """Every full host (of those `ask` can use); a drained host counts as full."""
        return [
            f"gpu_host_drained_{name}"
            if name in self.drained
            else full_reason(name, len(self._held_on(name)), h.max_jobs)
            for name, h in sorted(self.hosts.items())
            if (len(self._held_on(name)) >= h.max_jobs or name in self.drained)
            and (ask is None or self._can_use(ask, name))
        ]

    def carried(self, signals_per_run: int, inbox: list[Message]) -> PoolInput:
        return PoolInput(
            inbox=inbox,
            holders=list(self.holders.values()),
            line=list(self.line),
            readings=self.readings,
            holds_s=self.holds_s,
            shape_holds=self.shape_holds,
            signals_per_run=signals_per_run,
            continued=True,
            parked=list(self.parked.values()),
            warm=self.warm,
            capabilities=self.capabilities,
            drained=self.drained,
            hosts=list(self.hosts.values()),
            changing=list(self.changing.values()),
            turns=self.turns,
            promised=self.promised,
            preemptions=self.preemptions,
        )

    # --- inside ----------------------------------------------------------------------------

    def _note(self, host: str, reading: Reading) -> None:
        if host not in self.hosts:  # a host nobody configured is nobody's to carry
            return
        known = self.readings.get(host)
        if known is None or reading.at >= known.at:
            self.readings[host] = reading

    def _note_capabilities(self, host: str, found: HostCapabilities | None) -> None:
        known = self.capabilities.get(host)
        if (
            found is not None
            and host in self.hosts
            and (known is None or found.read_at > known.read_at)
        ):
            self.capabilities[host] = found

    def _usable(self, seen: HostSeen, mode: Mode) -> bool:
        return seen.reachable and (seen.headroom or mode == "any")

    def _held_on(self, host: str) -> list[Holder]:
        return [h for h in self.holders.values() if self._counted_on(h) == host]

    def _free_hosts(self) -> list[str]:
        counts = self.in_use()
        for host in self.promised.values():  # let go of for a preemptor: its, nobody else's
            if host in counts:
                counts[host] += 1
        return [
            n
            for n, h in sorted(self.hosts.items())
            if counts[n] < h.max_jobs and n not in self.drained
        ]

    @staticmethod
    def _can_use(ask: PoolAsk, host: str) -> bool:
        return host not in ask.unfit

    def _wanted(self, hosts: list[str]) -> list[str]:
        """Of `hosts`, those a job in line can use."""
        return [n for n in hosts if any(self._can_use(a, n) for a in self.line)]

    def _place_for(self, ask: PoolAsk, usable: list[str]) -> str | None:
        """Among `usable` hosts with a free place that can run the job, one where its models
        are warm (`prefer_warm`), then the one with the most free places (the job's own
        preference, then the name, break ties)."""
        free = set(self._free_hosts())
        order = [n for n in usable if n in free and self._can_use(ask, n)]
        if not order:
            return None
        counts = self.in_use()
        return max(
            order,
            key=lambda n: (
                self.prefer_warm and self._warm(ask, n),
                self.hosts[n].max_jobs - counts[n],
                -order.index(n),
            ),
        )

    def _admit(self, ask: PoolAsk, host: str, now: datetime) -> Sent:
        if ask.models:
            self.warm[host] = list(ask.models)
        self.holders[ask.job_id] = Holder(
            job_id=ask.job_id,
            asked_at=ask.asked_at,
            host=host,
            since=now,
            checked_at=now,
            run_id=ask.run_id,
            shape=ask.shape,
            comfyui=self.hosts[host].ref.comfyui,
            team=ask.team,
            priority=ask.priority,
            preempted=ask.preempted_by is not None,
        )
        self.turns = fair_share.served(self.turns, self.team_of(ask.team), self.shares)
        return ask.job_id, PoolAnswer(asked_at=ask.asked_at, host=host)

    def _in_line(self, job_id: str) -> PoolAsk | None:
        return self._lined.get(job_id)

    def _unline(self, ask: PoolAsk) -> None:
        del self.line[bisect.bisect_left(self.line, self._key(ask), key=self._key)]
        del self._lined[ask.job_id]
