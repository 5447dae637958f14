"""GpuPoolWorkflow: the one owner of the GPU hosts' places and the line (docs/design.md, "GPU
admission").

A long-lived entity workflow per namespace and task queue, started by the first job's ask
(signal-with-start). Its signal handlers only queue what arrived; the run applies it to the
`PoolBook` in order, answers each job by a signal (a place, a position, or "full"), probes the
hosts with a free place while someone waits (one probe per host every SPILLWAY_POOL_REPROBE_S,
however many wait), checks the holders it has not heard from (a terminated or reset-away holder's
place comes back) and continues as new with its places and line.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Coroutine
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows import activity_calls as calls
from workflows.timers import Alarms

with workflow.unsafe.imports_passed_through():
    from activities.pool import FindHolders, HolderCheck, ReadPlaces
    from spillway.core import names
    from spillway.core.gpu_pool import (
        Holder,
        LateCheck,
        Message,
        PoolAnswer,
        PoolAsk,
        PoolDrain,
        PoolHost,
        PoolInput,
        PoolLeave,
        PoolPlaces,
        PoolView,
        Quoted,
        Reading,
        Sent,
    )
    from spillway.core.models import Policy, QueueSpot
    from spillway.core.pool_book import PoolBook
    from workflows import texts

POOL_JOB = "gpu-pool"  # the job id the pool's own probes and policy reads carry
# A holder not heard from for the policy's pool_holder_check_s (1 min) is asked whether it still
# holds its place, and the holders are checked every half of that: a closed one's place is free
# again within 1.5 times it (90 s).
# Runs of 0.5.0 start without asking the jobs which places they hold.
FIND_HOLDERS = "gpu-pool-find-holders"
# Runs of 0.5.0 free a place on a give-back's word.
VERIFIED_LEAVES = "gpu-pool-verified-leaves"
# Runs of 0.5.0 order their line by priority alone.
AGED_LINE = "gpu-pool-aged-line"
# Runs of 0.6.0 keep no memo of their holders, take a lined job's changed mode or priority on
# the ask's word, and count every place a running job claims when they start after a pool ended.
OWN_WORD = "gpu-pool-own-word"
# Runs of 0.6.0 send every answer at once, however many are in flight.
BOUNDED_ANSWERS = "gpu-pool-bounded-answers"
POLICY_EVERY = timedelta(minutes=5)  # the hosts and their places as the workers have them now
POLICY_AT_MOST = timedelta(seconds=10)  # read sooner when a job's policy shows other places
DETAILS_HEAD = 20  # jobs of the line the UI's current details name
IDLE_AT_LEAST = timedelta(milliseconds=100)  # a timer due now is a timer, not a busy loop
SIGNALS_IN_FLIGHT = 500  # SPILLWAY_POOL_SIGNALS_IN_FLIGHT's default, until the policy is read


@workflow.defn(name=names.GPU_POOL)
class GpuPoolWorkflow:
    @workflow.init
    def __init__(self, inp: PoolInput) -> None:
        if workflow.info().continued_run_id is None:
            # Render times come only from renders this pool (or the run it continues) saw:
            # spillway starts a pool with none, and times in a start's input are the word of
            # whoever started it (an estimate that makes every patient job late).
            inp = inp.model_copy(update={"holds_s": {}, "shape_holds": {}})
        self._book = PoolBook(inp)
        self._inbox: list[PoolAsk | PoolLeave | PoolDrain] = [
            m
            for carried in inp.inbox
            for m in (carried.ask, carried.leave, carried.drain)
            if m is not None
        ]
        self._received = 0
        self._policy: Policy | None = None
        # Answers on their way, and the probe and the holder check under way: the pool goes on
        # taking asks and give-backs meanwhile (a host's agent that is down costs its probe 10 s).
        self._tasks: set[asyncio.Task[None]] = set()
        # Temporal fails a workflow task that takes the run past 2,000 pending signals to other
        # workflows (limit.numPendingSignals.error), and one task may answer a whole line: at
        # most the policy's pool_signals_in_flight answers are in flight, the others wait here in
        # the order they were given. Below the bound an answer goes out in the task that gave it.
        self._in_flight = 0
        self._turns: deque[asyncio.Future[None]] = deque()
        self._bounded = False  # BOUNDED_ANSWERS
        self._probing = self._checking = self._clearing = self._confirming = False
        self._own_word = False  # OWN_WORD
        self._kept: dict[str, Any] | None = None  # the holders the memo shows
        self._policy_changed = False  # a job read other places than the pool's
        self._checked_at = self._policy_at = workflow.now()
        self._woken = False  # a probe or a check ended
        self._alarms = Alarms()
        self._aged = False  # the line ages (AGED_LINE)

    @workflow.run
    async def run(self, inp: PoolInput) -> None:
        book = self._book
        book.verify_leaves = workflow.patched(VERIFIED_LEAVES)
        self._aged = workflow.patched(AGED_LINE)
        self._own_word = book.confirm_changes = workflow.patched(OWN_WORD)
        self._bounded = workflow.patched(BOUNDED_ANSWERS)
        await self._read_policy()
        if not inp.continued and workflow.patched(FIND_HOLDERS):
            await self._find_holders()
        if book.drained:
            self._keep_drains()
        while True:
            now = workflow.now()
            if now - self._policy_at >= POLICY_EVERY or (
                self._policy_changed and now - self._policy_at >= POLICY_AT_MOST
            ):
                self._policy_at, self._policy_changed = now, False
                await self._read_policy()
            self._apply()
            self._send_all(book.late(workflow.now()))
            if not self._probing and book.to_probe(workflow.now(), self._reprobe):
                self._probing = True
                self._start(self._probe())
            if not self._clearing and book.to_clear(workflow.now(), self._check_every):
                self._clearing = True
                self._start(self._clear())
            if not self._confirming and book.changing:
                self._confirming = True
                self._start(self._confirm_changes())
            due = book.holders and workflow.now() - self._checked_at >= self._check_every
            if not self._checking and (due or book.check_now(workflow.now(), self._reprobe)):
                self._checked_at = workflow.now()
                self._checking = True
                self._start(self._check_holders())
            self._publish()
            if (
                self._received >= inp.signals_per_run
                or workflow.info().is_continue_as_new_suggested()
            ):
                break
            self._woken = False
            await self._alarms.wait(lambda: bool(self._inbox) or self._woken, self._idle())
        # What is under way ends first (answers reach their jobs); what arrives meanwhile is
        # carried, never applied here: an answer sent now could not be followed up.
        await workflow.wait_condition(lambda: not self._tasks and workflow.all_handlers_finished())
        inbox = [
            Message(ask=m)
            if isinstance(m, PoolAsk)
            else Message(drain=m)
            if isinstance(m, PoolDrain)
            else Message(leave=m)
            for m in self._inbox
        ]
        carried = book.carried(inp.signals_per_run, inbox)
        if not self._own_word:
            workflow.continue_as_new(carried)
        # The memo goes along as it is: a job's submit reads it between the runs.
        workflow.continue_as_new(carried, memo=self._memo())

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- what jobs send, and what the pool answers ---------------------------------------------

    @workflow.signal(name=names.POOL_ASK)
    def ask(self, ask: PoolAsk) -> None:
        self._inbox.append(ask)
        self._received += 1

    @workflow.signal(name=names.POOL_LEAVE)
    def give_back(self, leave: PoolLeave) -> None:
        self._inbox.append(leave)
        self._received += 1

    @workflow.signal(name=names.POOL_DRAIN)
    def drain(self, drain: PoolDrain) -> None:
        """`spillway host drain|resume`, applied in order with the jobs' messages."""
        self._inbox.append(drain)
        self._received += 1

    @workflow.signal(name=names.POOL_POLICY)
    def worker_started(self, places: PoolPlaces) -> None:
        """A worker started (a deploy, a restart): other places than the pool's are read from the
        workers' policy within POLICY_AT_MOST, not at the next 5-minute read."""
        self._policy_changed = self._policy_changed or self._book.places_differ(places.places)
        self._received += 1
        self._woken = True

    @workflow.query(name=names.POOL_VIEW)
    def view(self) -> PoolView:
        return self._book.view(workflow.now())

    @workflow.query(name=names.POOL_QUOTE)
    def quote(self, ask: PoolAsk) -> Quoted:
        return self._book.quote(ask, workflow.now())

    @workflow.query(name=names.POOL_LATE)
    def late_check(self, ask: PoolAsk) -> LateCheck:
        """Asked by a job (through its `gpu_pool_confirm_late` activity) before it leaves the line
        for the cloud: whether its own ask is late by this pool's estimate."""
        return self._book.confirm_late(ask, workflow.now())

    @workflow.query(name=names.POOL_SPOT)
    def spot(self, job_id: str) -> QueueSpot | None:
        return self._book.spot(job_id, workflow.now())

    def _apply(self) -> None:
        book, now = self._book, workflow.now()
        inbox, self._inbox = self._inbox, []
        sent: list[Sent] = []
        freed = False
        for message in inbox:
            if isinstance(message, PoolAsk):
                self._policy_changed = self._policy_changed or book.places_differ(message.places)
                sent += book.ask(message, now)
            elif isinstance(message, PoolDrain):
                freed = book.drain(message, now) or freed
                self._keep_drains()
                workflow.logger.info("gpu pool: %r", message)
            elif book.give_back(message, now):
                freed = True
        if freed:
            sent += book.admit(now, freshness=self._reprobe)
        if book.parked:  # a parked ask whose holder gave its place back is asked now
            sent += book.settle_parked(set(), now)
        self._send_all(sent)

    def _keep_drains(self) -> None:
        """In the memo, where a pool that starts after this one ended finds them."""
        drained = {n: d.model_dump(mode="json") for n, d in self._book.drained.items()}
        workflow.upsert_memo({names.POOL_DRAINED_MEMO: drained})

    def _keep_holders(self) -> None:
        """In the memo, written with the answers that give the places (one workflow task): a
        job's submit posts only on a place the memo shows as its own, and a pool that starts
        after this one ended finds there who held what."""
        if not self._own_word:
            return
        held = {j: p.model_dump(mode="json") for j, p in self._book.held_places().items()}
        kept = self._kept if self._kept is not None else {}
        changed: dict[str, Any] = {
            names.holder_memo(j): p for j, p in held.items() if kept.get(j) != p
        }
        changed |= {names.holder_memo(j): None for j in kept.keys() - held.keys()}  # removed
        if self._kept is None:
            changed[names.POOL_HOLDERS_MEMO] = True
        if changed:
            workflow.upsert_memo(changed)
        self._kept = held

    def _memo(self) -> dict[str, Any]:
        drained = {n: d.model_dump(mode="json") for n, d in self._book.drained.items()}
        held = {
            names.holder_memo(j): p.model_dump(mode="json")
            for j, p in self._book.held_places().items()
        }
        return {names.POOL_DRAINED_MEMO: drained, names.POOL_HOLDERS_MEMO: True, **held}

    def _send_all(self, sent: list[Sent]) -> None:
        for job_id, answer in sent:
            self._send(job_id, answer)
        if sent:
            self._keep_holders()

    def _send(self, job_id: str, answer: PoolAnswer) -> None:
        if answer.preempted_by is not None:
            workflow.logger.info(
                "gpu pool: %s gives its place on %s to %s (preempted)",
                job_id,
                answer.host,
                answer.preempted_by,
            )
            workflow.metric_meter().create_counter(
                "spillway_gpu_preemptions", "places given up for a preempting job"
            ).add(1, {"host": answer.host or ""})
        elif answer.host is not None:
            waited = (workflow.now() - answer.asked_at).total_seconds()
            workflow.metric_meter().create_histogram_float(
                "spillway_gpu_admission_wait", "seconds from a job's ask to its place", "s"
            ).record(waited, {"host": answer.host})
        self._start(self._signal(job_id, answer))

    async def _signal(self, job_id: str, answer: PoolAnswer) -> None:
        await self._turn()
        try:
            handle = workflow.get_external_workflow_handle(job_id)
            await handle.signal(names.POOL_ANSWER, answer)
        except Exception as err:  # the job is gone: its place or its spot in line is free
            workflow.logger.info("gpu pool: job %s did not take its answer: %s", job_id, err)
            self._inbox.append(PoolLeave(job_id=job_id, asked_at=answer.asked_at))
        finally:
            self._in_flight -= 1
            self._pass_turns()

    async def _turn(self) -> None:
        """Returns when this answer may be signalled: at once while fewer than the bound are in
        flight and none wait before it, else when those before it have gone."""
        if not self._turns and self._in_flight < self._signals_in_flight:
            self._in_flight += 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._turns.append(turn)
        await turn

    def _pass_turns(self) -> None:
        while self._turns and self._in_flight < self._signals_in_flight:
            turn = self._turns.popleft()
            if not turn.done():  # a waiting answer cancelled with the run holds no place
                self._in_flight += 1
                turn.set_result(None)

    # --- the hosts -----------------------------------------------------------------------------

    @property
    def _reprobe(self) -> timedelta:
        return timedelta(seconds=self._policy.pool_reprobe_s if self._policy else 2.0)

    @property
    def _signals_in_flight(self) -> float:
        if not self._bounded:
            return math.inf
        return self._policy.pool_signals_in_flight if self._policy else SIGNALS_IN_FLIGHT

    @property
    def _check_every(self) -> timedelta:
        return timedelta(seconds=(self._policy.pool_holder_check_s if self._policy else 60.0) / 2)

    def _idle(self) -> timedelta | None:
        """How long to sleep when nothing arrives: until the next probe is due while someone
        waits, the next holder check while anyone holds a place, or until a message. Due times,
        not whole intervals: a message arriving meanwhile must not put them off."""
        now, waits = workflow.now(), []
        if not self._probing:
            probe = self._book.next_probe(now, self._reprobe)
            if probe is not None:
                waits.append(probe - now)
        if self._book.holders and not self._checking:
            waits.append(self._checked_at + self._check_every - now)
            leave = self._book.next_leave_check(self._reprobe)
            if leave is not None:
                waits.append(leave - now)
        late = self._book.next_late(now)
        if late is not None:
            waits.append(late - now)
        if self._policy_changed:
            waits.append(self._policy_at + POLICY_AT_MOST - now)
        if not self._clearing:
            clear = self._book.next_clear(now, self._check_every)
            if clear is not None:
                waits.append(clear - now)
        return max(min(waits), IDLE_AT_LEAST) if waits else None

    async def _read_policy(self) -> None:
        self._policy = policy = await calls.read_policy(POOL_JOB)
        self._book.configure([PoolHost(ref=h, max_jobs=h.max_jobs) for h in policy.hosts])
        aging = self._aged and policy.pool_aging_s > 0
        self._book.set_aging(timedelta(seconds=policy.pool_aging_s) if aging else None)
        self._book.prefer_warm = policy.pool_prefer_warm
        self._book.preempt = policy.preempt
        self._book.preempt_max_run_s = policy.preempt_max_run_s
        self._book.set_teams(policy.team_shares, policy.default_team, policy.team_max_waiting)
        self._pass_turns()  # a bound raised lets more go now

    async def _find_holders(self) -> None:
        """An earlier pool ended (an operator terminated it, say) while jobs held places: they
        render on, and their places count before anyone is admitted, or the card is overbooked.
        The places that pool's memo shows are asked about at once (a holder that ended since,
        terminated mid-render say, has its prompt taken out before the place is free); a place a
        running job claims that the memo does not show had gone back before that pool ended (a
        run reset to after its admission replays it) and counts nowhere. Its line is taken back
        in its order (each job would ask again by itself within SPILLWAY_POOL_LINE_CHECK_S)."""
        queue = workflow.info().task_queue.removesuffix(names.POOL_SUFFIX)
        try:
            found = await calls.pool_find(FindHolders(task_queue=queue))
        except ActivityError as err:
            workflow.logger.warning("gpu pool: places held before it were not found: %s", err)
            return
        now = workflow.now()
        book = self._book
        book.drained = {n: d for n, d in found.drained.items() if n in book.hosts}
        shown = found.holders if self._own_word else None
        for held in found.held:
            if held.host is None:
                continue
            if shown is None or (
                held.job_id in shown and shown[held.job_id].asked_at == held.asked_at
            ):
                book.adopt(held.job_id, held.asked_at, held.host, now, held.run_id, team=held.team)
            else:
                workflow.logger.warning(
                    "gpu pool: %s claims a place on %s the pool before it had taken back",
                    held.job_id,
                    held.host,
                )
        for job_id, place in (shown or {}).items():
            book.adopt(job_id, place.asked_at, place.host, now, place.run_id, check_now=True)
        for held in found.held:
            if held.host is None:
                lined = PoolAsk(
                    job_id=held.job_id,
                    asked_at=held.asked_at,
                    priority=held.priority,
                    mode=held.mode,
                    again=True,
                    run_id=held.run_id,
                    unfit=held.unfit,
                    models=held.models,
                    start_by=held.start_by,
                    by_deadline=held.by_deadline,
                    team=held.team,
                )
                self._send_all(book.ask(lined, now))

    async def _probe(self) -> None:
        try:
            due = self._book.to_probe(workflow.now(), self._reprobe)
            readings = await asyncio.gather(
                *(calls.probe(POOL_JOB, host) for host in due), return_exceptions=True
            )
            now = workflow.now()
            for host, load in zip(due, readings, strict=True):
                if isinstance(load, BaseException):
                    if not isinstance(load, ActivityError):
                        raise load
                    reading = Reading(reachable=False, headroom=False, at=now)
                else:
                    headroom = load.reachable and not load.overloaded
                    reading = Reading(reachable=load.reachable, headroom=headroom, at=now)
                self._book.note_probe(host.name, reading)
            self._send_all(self._book.admit(now, freshness=self._reprobe))
        finally:
            self._probing, self._woken = False, True

    async def _check_holders(self) -> None:
        try:
            book = self._book
            started = workflow.now()
            unheard = book.unheard(started, self._check_every * 2, self._reprobe)
            if not unheard:
                return
            queue = workflow.info().task_queue.removesuffix(names.POOL_SUFFIX)
            checked = await calls.pool_check(HolderCheck(holders=unheard, task_queue=queue))
            now = workflow.now()
            sent: list[Sent] = []
            heard_at = started if book.verify_leaves else now
            for holder in unheard:
                if holder.job_id in checked.gone:
                    workflow.logger.info("gpu pool: %s is gone, its place is free", holder.job_id)
                    if holder.job_id in checked.reset:
                        book.free(holder, now, checked.reset[holder.job_id], whole_run=True)
                    else:
                        book.free(holder, now, checked.prompts.get(holder.job_id))
                else:  # holding, or not known now: asked again at a later round
                    book.heard(holder.job_id, heard_at)
            for job_id in book.parked.keys() & set(checked.answered):
                workflow.logger.warning(
                    "gpu pool: an ask named %s, which still holds its place: dropped", job_id
                )
            sent += book.settle_parked(set(checked.answered), now)
            sent += book.admit(now, freshness=self._reprobe)
            self._send_all(sent)
        except ActivityError as err:
            workflow.logger.warning("gpu pool: holders not checked: %s", err.cause or err)
        finally:
            self._checking, self._woken = False, True

    async def _confirm_changes(self) -> None:
        """The pending changes of lined asks, against each job's own place."""
        book = self._book
        try:
            queue = workflow.info().task_queue.removesuffix(names.POOL_SUFFIX)
            read = await calls.pool_read_places(
                ReadPlaces(job_ids=list(book.changing), task_queue=queue)
            )
            sent, dropped = book.changes_confirmed(read.places, workflow.now())
            for job_id in dropped:
                workflow.logger.warning(
                    "gpu pool: an ask named %s with a mode or priority its own place does not "
                    "show: dropped",
                    job_id,
                )
            sent += book.admit(workflow.now(), freshness=self._reprobe)
            self._send_all(sent)
        except ActivityError as err:
            workflow.logger.warning("gpu pool: changed asks not confirmed: %s", err.cause or err)
            book.changing.clear()  # a job that asked one asks again, unanswered
        finally:
            self._confirming, self._woken = False, True

    async def _clear(self) -> None:
        """Takes the prompts of left places out of their hosts' ComfyUI, then frees them; a host
        that does not answer keeps its place held until a later try succeeds."""
        book = self._book
        try:
            due = book.to_clear(workflow.now(), self._check_every)
            for holder in due:
                holder.cleared_at = workflow.now()
            results = await asyncio.gather(
                *(self._take_out(holder) for holder in due), return_exceptions=True
            )
            now = workflow.now()
            sent: list[Sent] = []
            for holder, result in zip(due, results, strict=True):
                if isinstance(result, BaseException):
                    if not isinstance(result, ActivityError):
                        raise result
                    workflow.logger.warning(
                        "gpu pool: prompt %s of %s not taken out of %s yet: %s",
                        holder.clearing,
                        holder.job_id,
                        holder.host,
                        result.cause or result,
                    )
                else:
                    book.cleared(holder, now)
            sent += book.settle_parked(set(), now)
            sent += book.admit(now, freshness=self._reprobe)
            self._send_all(sent)
        finally:
            self._clearing, self._woken = False, True

    async def _take_out(self, holder: Holder) -> None:
        host = self._book.host_of(holder)
        if host is None or holder.clearing is None:  # a host no longer configured counts nowhere
            return
        await calls.pool_clear(holder.clearing, host.ref, whole_run=holder.clearing_run)

    def _publish(self) -> None:
        book = self._book
        meter = workflow.metric_meter()
        in_use = meter.create_gauge("spillway_gpu_places_in_use", "places held per GPU host")
        for host, n in book.in_use().items():
            in_use.set(n, {"host": host})
        meter.create_gauge("spillway_gpu_line_length", "jobs waiting for a GPU place").set(
            len(book.line)
        )
        held, waiting = book.held_by_team(), book.waiting_by_team()
        team_places = meter.create_gauge("spillway_gpu_team_places", "GPU places held per team")
        for team, n in held.items():
            team_places.set(n, {"team": team})
        team_line = meter.create_gauge("spillway_gpu_team_waiting", "jobs in the GPU line per team")
        for team, n in waiting.items():
            team_line.set(n, {"team": team})
        # The head of the line only: this runs after every batch of messages, whatever its length.
        head = book.view(workflow.now(), DETAILS_HEAD)
        teams = None
        if len(book.shares) > 1:
            teams = {t: (held.get(t, 0), waiting.get(t, 0)) for t in {**held, **waiting}}
        workflow.set_current_details(texts.pool_details(head, len(book.line), teams))
        self._keep_holders()
