"""Start, follow and decide video jobs from Python: the API the `spillway` command itself uses.

    import asyncio
    from pathlib import Path

    from spillway.client import SpillwayClient

    async def main() -> None:
        client = await SpillwayClient.connect()  # TEMPORAL_ADDRESS, ... as every Temporal tool
        plan = await client.submit(Path("my_graph_api.json"), prompt="a heron at dawn", wait=True)
        print(plan.state, plan.route, [out.path for out in plan.outputs])

    asyncio.run(main())

Every method raises one of two errors from spillway.core.errors, each with a one-line message:
`ConfigError` for bad input or configuration (nothing was started; the command's exit 2) and
`Failed` when the operation was refused or failed (job not found, already exists, not awaiting
approval, Temporal unreachable; exit 1). A job that ends failed is not an exception: its plan says
`state="failed"` and `error`.

Clients in other languages start the workflow `VideoJobWorkflow` themselves with the JSON of a job
(workflow id = job id, task queue SPILLWAY_TASK_QUEUE): `spillway.schema.schemas()`, committed
as docs/schema/*.json, is that contract (docs/clients.md, "Starting jobs from code").
"""

from __future__ import annotations

import asyncio
import builtins  # `SpillwayClient.list` hides `list` inside the class
import dataclasses
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

from pydantic import ValidationError
from temporalio.client import Client
from temporalio.contrib.pydantic import PydanticPayloadConverter

from activities.storage.opening import presign_outputs
from spillway.client import jobs
from spillway.client.inputs import prepare_inputs
from spillway.client.jobs import JobSummary
from spillway.client.new_jobs import known_team, make_decision, make_job, signed_for, with_team
from spillway.core.errors import ConfigError, Failed, JobNotFound
from spillway.core.models import (
    FINAL_STATES,
    ApprovalDecision,
    CancelNote,
    JobInput,
    JobState,
    Plan,
    PriorityChange,
    QueueSpot,
    Quote,
    VideoJob,
)
from spillway.core.settings import Settings, describe_validation_error, load_settings

if TYPE_CHECKING:
    from spillway.core.ledger import LedgerSummary

__all__ = [
    "ConfigError",
    "Failed",
    "JobSummary",
    "Plan",
    "SpillwayClient",
    "make_decision",
    "make_job",
]

POLL_S = 1.0  # how often `wait` reads the job
# How long `cancel` waits for `cancelled`: a render stops at its next node boundary, which a
# slow node (a video decode) may take minutes to reach.
CANCEL_WITHIN_S = 600.0
GONE_AFTER_S = 30.0  # how long `wait` asks again for a job it has seen that the server denies


class SpillwayClient:
    """Jobs on one Temporal namespace and spillway task queue.

    `SpillwayClient.connect()` connects as the workers do; `SpillwayClient(temporal_client)` uses
    a client you have (its payload converter becomes pydantic's, which spillway's models need;
    its codec, if any, is kept). `settings` default to the environment's (spillway.core.settings:
    SPILLWAY_TASK_QUEUE, the budgets `budget()` falls back on); `task_queue` overrides theirs.
    """

    def __init__(
        self,
        temporal: Client,
        *,
        settings: Settings | None = None,
        task_queue: str | None = None,
    ) -> None:
        converter = temporal.data_converter
        if not issubclass(converter.payload_converter_class, PydanticPayloadConverter):
            converter = dataclasses.replace(
                converter, payload_converter_class=PydanticPayloadConverter
            )
            config = temporal.config()
            config["data_converter"] = converter
            temporal = Client(**config)
        self.temporal = temporal
        self.settings = settings if settings is not None else load_settings()
        self.task_queue = task_queue or self.settings.SPILLWAY_TASK_QUEUE

    @classmethod
    async def connect(
        cls, *, settings: Settings | None = None, task_queue: str | None = None
    ) -> SpillwayClient:
        """Connect through temporalio.envconfig (TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE,
        TEMPORAL_API_KEY, the TLS variables, TEMPORAL_PROFILE; default localhost:7233).
        ConfigError for a bad setting, Failed when Temporal does not answer."""
        from spillway.temporal import TemporalUnreachable, connect

        settings = settings if settings is not None else load_settings()
        try:
            temporal = await connect()
        except TemporalUnreachable as exc:
            raise Failed(str(exc)) from None
        return cls(temporal, settings=settings, task_queue=task_queue)

    async def submit(
        self,
        graph: dict[str, Any] | Path,
        *,
        job_id: str | None = None,
        prompt: str | None = None,
        model: str | None = None,
        duration: int | None = None,
        resolution: str | None = None,
        inputs: Sequence[str | JobInput] | None = None,
        callback_url: str | None = None,
        priority: int = 3,
        team: str | None = None,
        wait: bool = False,
        on_progress: Callable[[Plan], None] | None = None,
    ) -> Plan:
        """Start a job: `make_job(...)` (every argument checked, see there), then `start`.
        Returns its plan (`state="probing"`), or with `wait=True` its final plan.

        `inputs`: image files for image-to-video graphs, "NODE=PATH" or "PATH" (the graph's one
        image loader), stored before the job starts; or JobInput already stored.
        """
        job = make_job(
            graph,
            job_id=job_id,
            prompt=prompt,
            model=model,
            duration=duration,
            resolution=resolution,
            callback_url=callback_url,
            priority=priority,
            team=team,
        )
        return await self.start(job, inputs=inputs, wait=wait, on_progress=on_progress)

    async def start(
        self,
        job: VideoJob,
        *,
        inputs: Sequence[str | JobInput] | None = None,
        wait: bool = False,
        on_progress: Callable[[Plan], None] | None = None,
    ) -> Plan:
        """Start a job made by `make_job`, as `submit` does. Failed when its id exists;
        ConfigError for a team the teams file (`settings`' SPILLWAY_TEAMS_FILE) does not name."""
        job = with_team(job, self.settings)
        if inputs:
            job = job.model_copy(update={"inputs": [*job.inputs, *await self._store(job, inputs)]})
        await jobs.check_addresses(job, self.settings)
        await jobs.submit(self.temporal, job, self.task_queue)
        if wait:
            return await self.wait(job.job_id, on_progress)
        return Plan(job_id=job.job_id, state="probing")

    async def status(self, job_id: str) -> Plan:
        """The job's plan: state, route, reasons, approval, progress, outputs, error. Works for
        running and finished jobs, with or without a worker running. An output kept in object
        storage (`uri`) gets a `url` presigned for an hour with this machine's
        SPILLWAY_OUTPUT_URL and AWS_* settings (none without them). Failed: no such job."""
        return await presign_outputs(await jobs.status(self.temporal, job_id), self.settings)

    async def list(
        self,
        state: JobState | None = None,
        team: str | None = None,
        limit: int | None = None,
        task_queue: str | None = None,
    ) -> builtins.list[JobSummary]:
        """Jobs, newest first, optionally only those in `state` and of `team` (one the teams
        file names; the default team's include the jobs started without one); each with its
        id, state, route, start time, GPU host and priority (None for a job whose client set no
        priority memo); `limit`: the newest that many only; `task_queue`: only the jobs started
        on that queue (None: the namespace's, whatever their queue, as `spillway list` shows)."""
        if state is not None and state not in get_args(JobState):
            raise ConfigError(f"unknown state {state!r}; one of {', '.join(get_args(JobState))}")
        default = False
        if team is not None:
            team, teams = known_team(team, self.settings)
            default = team == teams.default
        return await jobs.list_jobs(
            self.temporal, state, team, default_team=default, limit=limit, task_queue=task_queue
        )

    async def approve(
        self, job_id: str, by: str, reason: str = "", over_budget: bool = False
    ) -> str:
        """Send a job that awaits approval to the paid cloud; what the job answered, e.g.
        "approved: ...". Failed when it is not waiting, or the budget cannot cover it and
        `over_budget` is False (the message has the numbers). With no worker running the
        decision goes as a signal, applied when one runs (the answer says so)."""
        return await self.decide(job_id, make_decision(True, by, reason, over_budget))

    async def reject(self, job_id: str, by: str, reason: str = "") -> str:
        """Keep a job that awaits approval local; as `approve`, otherwise."""
        return await self.decide(job_id, make_decision(False, by, reason))

    async def decide(self, job_id: str, decision: ApprovalDecision) -> str:
        """`approve` or `reject` with a decision made already (`make_decision`, or the JSON the
        Temporal UI's signal takes: ApprovalDecision.model_validate_json(...)). Signed for the
        job when `settings` hold SPILLWAY_APPROVAL_SECRET (workers that have it use only signed
        decisions); a decision that carries a signature already goes as it is."""
        if self.settings.SPILLWAY_APPROVAL_SECRET is not None and decision.signature is None:
            binding = await jobs.binding(self.temporal, job_id, decision.approved)
            decision = signed_for(binding, decision, self.settings)
        return await jobs.decide(self.temporal, job_id, decision)

    async def quote(self, job: VideoJob) -> Quote:
        """Where `job` would run now and what the cloud would cost (`spillway quote`), under
        the rules a job applies; nothing is started. Failed when no GPU host can run its graph
        or no worker answers; ConfigError for a team the teams file does not name (`start`)."""
        return await jobs.quote(self.temporal, self.task_queue, with_team(job, self.settings))

    async def set_priority(
        self,
        job_id: str,
        priority: int,
        by: str,
        reason: str = "",
        *,
        on_note: Callable[[str], None] | None = None,
    ) -> QueueSpot | None:
        """`spillway priority`: a job waiting in the GPU line moves to `priority` (1 first), and
        so does the workflow's Temporal priority, which the Temporal UI shows. A server that
        cannot change the latter (jobs.follow_priority) does not fail the call, since the job's
        priority did change: `on_note` gets the line that says so (default: a warning logged
        by "spillway.client")."""
        try:
            change = PriorityChange(priority=priority, by=by, reason=reason)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc, "priority")) from None
        spot = await jobs.set_priority(self.temporal, job_id, change)
        note = await jobs.follow_priority(self.temporal, job_id, priority)
        if note is not None:
            (on_note or logging.getLogger(__name__).warning)(note)
        return spot

    async def cancel(
        self,
        job_id: str,
        by: str,
        reason: str = "",
        *,
        within_s: float = CANCEL_WITHIN_S,
        on_progress: Callable[[Plan], None] | None = None,
    ) -> Plan:
        """`spillway cancel`: records who cancels and why in the job, cancels it, and returns
        its plan once it shows `cancelled` (it lets go of its ComfyUI prompt first, which a
        render does at its next node boundary). Failed for a job not found or already ended
        (naming its state), one that ended otherwise meanwhile, or one still not cancelled after
        `within_s` (no worker running, say: the cancel stays asked)."""
        try:
            note = CancelNote(by=by, reason=reason)
        except ValidationError as exc:
            raise ConfigError(describe_validation_error(exc, "cancel")) from None
        await jobs.cancel(self.temporal, job_id, note)
        seen: builtins.list[Plan] = []

        def keep(plan: Plan) -> None:
            seen[:] = [plan]
            if on_progress is not None:
                on_progress(plan)

        try:
            async with asyncio.timeout(within_s):
                plan = await self.wait(job_id, keep)
        except TimeoutError:
            state = seen[0].state if seen else "unknown"
            raise Failed(
                f"job {job_id} still shows {state} {within_s:g} s after its cancel was asked; "
                "the cancel stays asked, and a job moves on only while a worker runs: follow it "
                f"with spillway watch {job_id}"
            ) from None
        if plan.state != "cancelled":
            raise Failed(f"job {job_id} ended {plan.state} before the cancel took effect")
        return plan

    async def wait(self, job_id: str, on_progress: Callable[[Plan], None] | None = None) -> Plan:
        """The job's final plan (completed, failed or cancelled), read every POLL_S seconds;
        `on_progress(plan)` on the first read and whenever state, route or progress change.
        No worker is needed to wait, but only a running one moves the job on."""
        seen: tuple[Any, ...] | None = None
        missing_since: float | None = None
        while True:
            try:
                plan = await jobs.status(self.temporal, job_id)
            except JobNotFound:
                # A starved or restarting dev server has answered NOT_FOUND for a job it had just
                # shown: a job seen once is asked for again before it is said to be gone.
                now_s = asyncio.get_running_loop().time()
                missing_since = missing_since or now_s
                if seen is None or now_s - missing_since >= GONE_AFTER_S:
                    raise
                await asyncio.sleep(POLL_S)
                continue
            missing_since = None
            now = (plan.state, plan.route, plan.progress)
            if on_progress is not None and now != seen:
                on_progress(plan)
            seen = now
            if plan.state in FINAL_STATES:
                return await presign_outputs(plan, self.settings)
            await asyncio.sleep(POLL_S)

    async def budget(self) -> LedgerSummary:
        """Cloud spending: today's and this month's budget, spent, reserved and left, and every
        create of this month; read through a running worker (Failed without one)."""
        from spillway.client.budget import ledger_summary

        settings = self.settings
        if self.task_queue != settings.SPILLWAY_TASK_QUEUE:
            settings = settings.model_copy(update={"SPILLWAY_TASK_QUEUE": self.task_queue})
        return await ledger_summary(self.temporal, settings)

    async def _store(
        self, job: VideoJob, inputs: Sequence[str | JobInput]
    ) -> builtins.list[JobInput]:
        stored = [i for i in inputs if isinstance(i, JobInput)]
        specs = [i for i in inputs if isinstance(i, str)]
        if specs:
            stored += await prepare_inputs(
                self.settings, job.job_id, job.graph, specs, cloud=job.cloud is not None
            )
        return stored
