"""Models that cross a boundary: activity inputs and results, CLI JSON output.

Everything here travels through Temporal's history with the pydantic data converter, so it must
never hold a secret.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from spillway.core.ledger import Authorisation, BudgetView


# --- a GPU host's load, and the policy the workers decide with -----------------------------
class Thresholds(BaseModel):
    model_config = ConfigDict(frozen=True)

    vram_busy_pct: float
    util_busy_pct: float


class LoadStatus(BaseModel):
    """One measurement of a GPU host's load (docs/design.md, "The load probe").

    `None` in a reading means "not measured" (source skipped or failed; see `errors`).
    `overloaded` is the OR of the three sources, and a failed source never contributes to it.
    """

    reachable: bool
    overloaded: bool
    vram_pct: float | None = None
    gpu_util_pct: float | None = None
    queue_pending: int | None = None
    queue_running: int | None = None
    guard_busy: bool | None = None
    guard_job: str | None = None
    reasons: list[str] = []
    errors: list[str] = []
    measured_at: datetime
    thresholds: Thresholds
    host: str | None = None  # the GPU host measured
    agent: str | None = None  # the agent that measured it (pid@hostname)
    # With several hosts, the decision's reading keeps every host's own (docs/design.md, "GPU
    # hosts and agents"): overloaded only when every host that answered is.
    hosts: dict[str, LoadStatus] = {}


class HostRef(BaseModel):
    """What a job needs to reach a GPU host: its agent's task queues (read with the policy)."""

    name: str
    task_queue: str  # probe, submit, cancel: short
    waits_queue: str  # waiting on ComfyUI and downloading: long, many at a time
    max_jobs: int = 2  # its places: spillway hands it at most this many jobs at once
    # Its ComfyUI (spillway.core.settings.url_key): what a host renamed in routing_tiers.json
    # keeps, so that the places its jobs hold under the old name still count. None: not known.
    comfyui: str | None = None


class Policy(BaseModel):
    """The worker's configuration that decides routes, read by an activity so that it is in the
    job's history. Never the key itself: only whether one is present."""

    model_config = ConfigDict(frozen=True)

    fallback_enabled: bool
    key_present: bool
    thresholds: Thresholds
    approval_timeout_s: float
    approval_recheck_s: float
    unreachable_confirm_s: float
    unreachable_give_up_s: float
    host_lost_after_s: float = 60.0  # not read by 0.2.0 workers: HOST_LOST_AFTER_S's default
    comfyui_max_attempts: int
    webhook_configured: bool
    ui_url: str
    await_loops_per_run: int
    heartbeat_timeout_s: float
    simulated: bool  # decided by a `spillway dev --simulate` worker
    hosts: list[HostRef]  # the GPU hosts, each reached on its agent's task queues
    providers: list[str]  # the cloud providers with keys, in CLOUD_PROVIDERS order
    job_webhook_configured: bool  # JOB_WEBHOOK_URL: every job's completion is posted
    # SPILLWAY_APPROVAL_SECRET: only signed decisions are used. Not read by 0.3.0 workers.
    approvals_signed: bool = False
    # SPILLWAY_LEDGER_SECRET: the spend ledger grants only on input spillway made. Not read by
    # 0.5.0 workers.
    ledger_sealed: bool = False
    pool_reprobe_s: float = 2.0  # SPILLWAY_POOL_REPROBE_S
    pool_line_check_s: float = 300.0  # SPILLWAY_POOL_LINE_CHECK_S
    pool_holder_check_s: float = 60.0  # SPILLWAY_POOL_HOLDER_CHECK_S
    pool_signals_in_flight: int = 500  # SPILLWAY_POOL_SIGNALS_IN_FLIGHT
    pool_ask_again_s: float = 120.0  # SPILLWAY_POOL_ASK_AGAIN_S
    pool_aging_s: float = 0.0  # SPILLWAY_POOL_AGING_S (0: none; not read by 0.5.0 workers)
    # Jobs ask each host whether it can run their graph (comfyui_fit). False in what 0.5.0
    # workers read, so their runs replay without the call: no patch marker in every job.
    host_fit: bool = False
    # SPILLWAY_POOL_PREFER_WARM (False in what 0.5.0 workers read)
    pool_prefer_warm: bool = False
    preempt: Literal["off", "priority", "fair"] = "off"  # SPILLWAY_PREEMPT
    preempt_max_run_s: float = 120.0  # SPILLWAY_PREEMPT_MAX_RUN_S
    # The teams' shares of the GPU places (SPILLWAY_TEAMS_FILE), and the team of a job that
    # names none; one team, `studio`, without a teams file.
    team_shares: dict[str, float] = {}
    default_team: str = "studio"
    # Each team's `max_waiting` (jobs in the GPU line at once), for the teams that have one.
    team_max_waiting: dict[str, int] = {}
    # Who may approve each team's cloud spend (a team missing here: anyone who may approve).
    # Empty in what workers before teams read, so their runs replay taking every approval.
    team_approvers: dict[str, list[str]] = {}
    overflow_after_s: float = 0.0  # CLOUD_OVERFLOW_AFTER_S: a job's patience by default
    # Local waits stop a stalled render (each agent's RENDER_STALL_S). False in what 0.5.0
    # workers read: their runs replay without the outcome.
    stall_rule: bool = False
    # A job's plan has the quote of its decision. False in what 0.5.0 workers read: their runs
    # replay without it (a plan that changed would publish where they did not).
    job_quote: bool = False
    # A cloud job tells the ledger how long its video took (the cloud's ETA). False in what
    # 0.5.0 workers read: their runs replay without the settle.
    cloud_eta: bool = False
    # The worker's own CLOUD_DAILY_BUDGET_USD / CLOUD_MONTHLY_BUDGET_USD (`budget_read`: False
    # from workers that did not say), and who it is to Temporal: `health` names a worker whose
    # settings differ from the ledger's budget, which they no longer change.
    budget_read: bool = False
    daily_budget_usd: float | None = None
    monthly_budget_usd: float | None = None
    worker: str = ""


class HostCapabilities(BaseModel):
    """What a host's ComfyUI can run, in brief (`spillway queue`, `health`): its node classes
    and the files in each of its model folders (those with any), as its agent last read them."""

    nodes: Annotated[int, Field(ge=0)]
    models: Annotated[dict[str, Annotated[int, Field(ge=0)]], Field(max_length=64)] = {}
    read_at: datetime


class LocalQuote(BaseModel):
    """Where a job would run here: the hosts that can run its graph, its position in the GPU
    line (0: a place now) and the estimated seconds until it would start (None: no renders
    seen yet)."""

    hosts: list[str]
    position: int
    eta_s: float | None = None


class CloudQuote(BaseModel):
    provider: str
    estimate_usd: float | None = None
    budget_left_usd: float | None = None  # the smaller of what the day and the month have left
    # Its recent create-to-done times' median (None: none recorded yet).
    eta_s: float | None = None

    @classmethod
    def of(cls, provider: str, view: BudgetView | None) -> CloudQuote:
        """With the figures of a budget view, when one was read."""
        if view is None:
            return cls(provider=provider)
        left = [v for v in (view.day_remaining_usd, view.month_remaining_usd) if v is not None]
        return cls(
            provider=provider,
            estimate_usd=view.estimate_usd,
            budget_left_usd=min(left, default=None),
            eta_s=view.eta_s,
        )


class Quote(BaseModel):
    """`spillway quote --json`: the route a job would take now, under the rules a job applies,
    with nothing started (docs/schema/quote.json)."""

    local: LocalQuote
    cloud: CloudQuote | None = None
    route: Literal["local", "cloud", "await_approval"]
    why: str


class HostView(BaseModel):
    """One GPU host as `spillway health` shows it: the reading its agent gave, or why none; and
    what it can run (or why that was not read)."""

    name: str
    task_queue: str
    load: LoadStatus | None = None
    error: str | None = None  # e.g. no agent picked the probe up
    capabilities: HostCapabilities | None = None
    capabilities_error: str | None = None


class WorkersView(BaseModel):
    """What the workers see (docs/design.md, "GPU hosts and agents"): the policy in force on
    them and a probe of every host, run on the hosts' own task queues."""

    policy: Policy
    hosts: list[HostView]


# --- what a job is -------------------------------------------------------------------------

JobId = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$",
        description="letters, digits, '.', '_', '-'; it names a folder and a workflow id",
    ),
]

# MiniMax's accepted combinations (model -> resolution -> durations in seconds).
MINIMAX_MODELS: dict[str, dict[str, frozenset[int]]] = {
    "MiniMax-Hailuo-2.3": {"768P": frozenset({6, 10}), "1080P": frozenset({6})},
    "MiniMax-Hailuo-02": {
        "512P": frozenset({6, 10}),
        "768P": frozenset({6, 10}),
        "1080P": frozenset({6}),
    },
    "T2V-01-Director": {"720P": frozenset({6})},
    "T2V-01": {"720P": frozenset({6})},
}


class CloudRequest(BaseModel):
    """What the cloud renders if the job goes there. Its vocabulary (model, resolution, duration)
    is MiniMax's, checked here at the edge; other providers map it onto theirs."""

    model_config = ConfigDict(frozen=True)

    prompt: Annotated[str, Field(min_length=1, max_length=2000)]
    model: str = "MiniMax-Hailuo-2.3"
    duration: int = 6
    resolution: str = "768P"
    prompt_optimizer: bool = True
    first_frame_image: str | None = None  # a public URL or a data: URL

    @model_validator(mode="after")
    def _minimax_accepts_it(self) -> CloudRequest:
        if not self.prompt.strip():
            # MiniMax refuses it (2013) only after the create call: refuse it here instead.
            raise ValueError("the prompt is blank")
        resolutions = MINIMAX_MODELS.get(self.model)
        if resolutions is None:
            raise ValueError(f"unknown MiniMax model {self.model!r}; one of {list(MINIMAX_MODELS)}")
        durations = resolutions.get(self.resolution)
        if durations is None:
            raise ValueError(
                f"{self.model} does not render {self.resolution}; one of {list(resolutions)}"
            )
        if self.duration not in durations:
            raise ValueError(
                f"{self.model} at {self.resolution} renders {sorted(durations)} s, "
                f"not {self.duration} s"
            )
        return self


class Progress(BaseModel):
    """Heartbeat details of long activities (ComfyUI wait, cloud polls, downloads)."""

    phase: str  # "queued", "running", "Processing", "downloading", ...
    node: str | None = None
    value: int | None = None
    max: int | None = None
    percent: float | None = None

    def brief(self) -> str:
        """As `status` and the Temporal UI show it: "running node 12 7/30 (23%)"."""
        node = f" node {self.node}" if self.node else ""
        done = f" {self.value}/{self.max}" if self.value is not None and self.max else ""
        pct = f" ({self.percent:.0f}%)" if self.percent is not None else ""
        return f"{self.phase}{node}{done}{pct}"


class RenderProgress(BaseModel):
    """A local render's progress, which its ComfyUI wait signals to the job for the Temporal
    UI's current details (status and watch read the wait's heartbeats)."""

    prompt_id: str
    progress: Progress


class OutputFile(BaseModel):
    path: str  # on the host that downloaded it; with SPILLWAY_OUTPUT_URL, the object's key
    bytes: int
    sha256: str
    uri: str | None = None  # s3://bucket/prefix/<job id>/<name> (SPILLWAY_OUTPUT_URL)
    url: str | None = None  # presigned by `spillway status` (never stored in history)


IMAGE_LOADERS = frozenset({"LoadImage"})  # nodes whose `image` input names an input file


class JobInput(BaseModel):
    """An input file of an image-to-video job (docs/design.md, "Clients, inputs and outputs"):
    stored once and referenced here by URI and sha256 (its bytes never travel in history)."""

    node: Annotated[str, Field(min_length=1, max_length=100)]  # the image loader's node id
    uri: Annotated[str, Field(min_length=1, max_length=2000)]  # s3://, file:// or https://
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None  # None: a URL
    name: str | None = None  # the file's original name (shown, never used as a path)


class Downloaded(BaseModel):
    outputs: list[OutputFile]


def _check_graph(graph: dict[str, Any]) -> dict[str, Any]:
    """An API-format ComfyUI graph: node id -> {"class_type": str, "inputs": {...}, ...}."""
    if not graph:
        raise ValueError("the graph has no nodes")
    for node_id, node in graph.items():
        if not isinstance(node, dict):
            raise ValueError(f"node {node_id!r} is not an object")
        if not isinstance(node.get("class_type"), str) or not node["class_type"]:
            raise ValueError(
                f"node {node_id!r} has no class_type: this is not an API-format graph "
                "(in ComfyUI use 'Export (API)')"
            )
        if not isinstance(node.get("inputs", {}), dict):
            raise ValueError(f"node {node_id!r}: inputs must be an object")
    return graph


ComfyGraph = Annotated[dict[str, Any], AfterValidator(_check_graph)]


class _DecisionFields(BaseModel):
    approved: bool
    by: Annotated[str, Field(min_length=1, max_length=100)]
    reason: Annotated[str, Field(max_length=1000)] = ""
    # `spillway approve --over-budget`: the only way past CLOUD_*_BUDGET_USD, per job.
    over_budget: bool = False


class ApprovalDecision(_DecisionFields):
    """The payload of the `approval` signal and update: `{"approved": true, "by": "bär",
    "reason": "client deadline"}` (the Temporal UI's "Send a Signal" takes this JSON).

    With SPILLWAY_APPROVAL_SECRET on the workers only a signed decision is used
    (spillway.core.approvals): `spillway approve|reject` and spillway.client sign it when their
    environment has the secret. A signature is no secret (it is in the job's history); the
    secret never travels."""

    signature: Annotated[str, Field(max_length=200)] | None = None  # "v1,<base64 HMAC-SHA256>"
    expires_at: datetime | None = None  # the signature's end, UTC


class ApprovalRecord(_DecisionFields):
    """The decision a job used: who, why, when, and whether the workers checked its signature."""

    at: datetime
    signed: bool = False


class PriorityChange(BaseModel):
    """`spillway priority JOB N --by WHO`: a job waiting in the GPU line moves to priority N
    (1 first); its place in the line follows at once."""

    priority: Annotated[int, Field(ge=1, le=5)]
    by: Annotated[str, Field(min_length=1, max_length=100)]
    reason: Annotated[str, Field(max_length=1000)] = ""


class PriorityRecord(PriorityChange):
    at: datetime
    was: int  # the priority before


# A plan is published as a memo on every change: a job moved a thousand times keeps it small.
MAX_PRIORITY_CHANGES = 20


class CancelNote(BaseModel):
    """`spillway cancel JOB --by WHO`: who cancels a job and why, signalled just before the
    cancel itself (a cancel request carries neither)."""

    by: Annotated[str, Field(min_length=1, max_length=100)]
    reason: Annotated[str, Field(max_length=1000)] = ""


class CancelRecord(CancelNote):
    at: datetime


class IgnoredSignal(BaseModel):
    """An approval or rejection that changed nothing, and why; `by` and `approved` are None
    when the signal could not be read at all (then `raw` shows what came)."""

    approved: bool | None = None
    by: str | None = None
    reason: str = ""
    over_budget: bool = False
    at: datetime
    why: str
    raw: str | None = None


class Overflow(BaseModel):
    trigger: Literal["overloaded", "unreachable"] | None = None
    last_signal: LoadStatus | None = None


class CloudAttempt(BaseModel):
    """A provider tried before the one that renders (or all of them, when every one said no)."""

    provider: str
    outcome: Literal["refused"]  # provably nothing made: the next provider was tried
    why: str


class CloudInfo(BaseModel):
    provider: str  # the one that renders (or rendered) the job
    task_id: str | None = None
    estimated_cost_usd: float | None = None
    cost_usd: float | None = None  # what the provider itself says it cost, when it says
    units: float | None = None  # the provider's own units (Kling: resource-pack units), not dollars
    authorised_by: str  # "armed" or the approver's name
    authorisation: Authorisation
    attempts: list[CloudAttempt] = []


JobState = Literal[
    "probing",
    "awaiting_approval",
    "queued",
    "running_local",
    "running_cloud",
    "completed",
    "failed",
    "cancelled",
]
FINAL_STATES: frozenset[str] = frozenset({"completed", "failed", "cancelled"})


class QueueSpot(BaseModel):
    """`status --json`'s `queue` while a job waits for a GPU place: 1 = next."""

    position: int
    ahead: int
    eta_s: float | None
    # What it waits for, as `spillway queue` says it (the pool's answer to `status`; None in
    # the plan the job publishes).
    waits_for: str | None = None
    # Where the pool has several teams: the places the job's team holds (held when it joined,
    # in the plan the job publishes).
    team_places: int | None = None


# "headroom": a place only while the host's probe shows headroom (a job that may still go to the
# cloud, waiting for a person); "any": the next free place on a host that answers.
PlaceMode = Literal["headroom", "any"]


class JobPlace(BaseModel):
    """A job's ask for a GPU place, as the job keeps it: when it asked (which names the ask) and
    the host that admitted it (None: still waiting for one)."""

    asked_at: datetime
    mode: PlaceMode = "any"
    host: str | None = None
    priority: int = 3  # the job's, so that a new pool can take back the line (0.5.0: none)
    unfit: list[str] = []  # the hosts known to lack what its graph needs
    models: list[str] = []  # the model files its graph loads (the pool prefers them warm)
    # Waiting by its patience: the latest start it waits for (its deadline, `by_deadline`).
    start_by: datetime | None = None
    by_deadline: bool = False
    team: str | None = None  # who the job is for (None: a job before teams)
    # It let go of its place for that job's preemption and waits in line again, at its first
    # ask time: a holder check finds it no longer holding that place.
    preempted_by: str | None = None


class Preemption(BaseModel):
    """A job whose place went to a more urgent job (SPILLWAY_PREEMPT): who took it, when the
    pool said so, on which host."""

    by: str
    at: datetime
    host: str


class Plan(BaseModel):
    """What `spillway status` and the `plan` query show (docs/design.md, "The command-line
    contract")."""

    job_id: str
    state: JobState = "probing"
    route: Literal["local", "cloud"] | None = None
    team: str | None = None  # who it is for (SPILLWAY_TEAMS_FILE); None: a job before teams
    reasons: list[str] = []
    overflow: Overflow = Overflow()
    approval: ApprovalRecord | None = None
    progress: Progress | None = None
    outputs: list[OutputFile] = []
    cloud: CloudInfo | None = None
    error: str | None = None
    prompt_id: str | None = None  # ComfyUI's, on the LOCAL route
    local_attempts: int = 0
    host: str | None = None  # the GPU host it runs (or ran) on, on the LOCAL route
    ignored_signals: list[IgnoredSignal] = []
    # While a job waits for a person: its cloud estimate and what the budgets have left.
    budget: BudgetView | None = None
    # Where it stands in the GPU line: as of when it joined in the plan the job publishes; now,
    # from the pool, in `spillway status`.
    queue: QueueSpot | None = None
    # The GPU hosts that can run its graph, and what each other one lacks (a few phrases), as
    # their agents read their ComfyUI; None: not asked (a cloud-only job, a run of 0.5.0).
    can_run: list[str] | None = None
    cannot_run: dict[str, list[str]] = {}
    # `spillway priority`: who moved it, when, why (the last MAX_PRIORITY_CHANGES).
    priority_changes: list[PriorityRecord] = []
    # An armed job waiting in the GPU line by its patience: it goes to the cloud then.
    patience_until: datetime | None = None
    # Its decision as `spillway quote` would have given it then (None: a run of 0.5.x).
    quote: Quote | None = None
    # Who asked `spillway cancel` for it, and why (None: nobody did, or a bare cancel request).
    cancelled_by: CancelRecord | None = None
    # Its place went to a more urgent job (SPILLWAY_PREEMPT): its render was taken out of
    # ComfyUI and it waited in line again (once at most).
    preempted: Preemption | None = None

    def hosts_text(self) -> str:
        """Which hosts can run the job, and what the others lack."""
        can = ", ".join(self.can_run or []) or "none"
        lacks = "; ".join(f"{host}: {', '.join(what)}" for host, what in self.cannot_run.items())
        return f"Can run on {can}; not on {lacks}"


class ApprovalNotice(BaseModel):
    """POSTed to APPROVAL_WEBHOOK_URL when a job starts waiting; `text` suits a Slack or
    Mattermost incoming webhook as it is."""

    text: str
    job_id: str
    trigger: Literal["overloaded", "unreachable"] | None
    reasons: list[str]
    last_signal: LoadStatus | None
    approve_command: str
    reject_command: str
    ui_link: str
    decide_by: datetime
    budget: BudgetView | None = None


class AwaitCarry(BaseModel):
    """What a job waiting for approval carries across continue-as-new."""

    plan: Plan
    policy: Policy
    approval_deadline: datetime
    give_up_at: datetime
    pending_approval: ApprovalDecision | None = None
    place: JobPlace | None = None  # its ask for a GPU place (None: a run from before the pool)
    patience_until: datetime | None = None  # an armed job in line goes to the cloud then


class VideoJob(BaseModel):
    """Input of VideoJobWorkflow (workflow id = job_id)."""

    job_id: JobId
    graph: ComfyGraph
    cloud: CloudRequest | None = None  # None: this job can only run locally
    # Image-to-video: uploaded to the host that renders; the first is the cloud's first frame.
    inputs: Annotated[list[JobInput], Field(max_length=16)] = []
    # Where job.completed|failed|cancelled go (else JOB_WEBHOOK_URL); not shown in the plan.
    callback_url: Annotated[str, Field(pattern=r"^https?://\S+$", max_length=2000)] | None = None
    # 1 (first) .. 5 (last): Temporal's task priority for the job; 1 also goes to the front of
    # ComfyUI's queue.
    priority: Annotated[int, Field(ge=1, le=5)] = 3
    # A job's patience (an armed job whose hosts are full waits in the GPU line while its
    # estimated start is within it, and goes to the cloud once it is not): seconds, or a time
    # by which it should be done (its patience: the time left minus a typical render). At most
    # one; neither: CLOUD_OVERFLOW_AFTER_S on the workers (0: overflow as soon as they are full).
    max_wait_s: Annotated[float, Field(ge=0, le=7 * 86400)] | None = None
    deadline: datetime | None = None
    # Who it is for (SPILLWAY_TEAMS_FILE); None: the default team.
    team: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")] | None = None
    carry: AwaitCarry | None = None  # set only by continue-as-new

    @model_validator(mode="after")
    def _one_patience(self) -> VideoJob:
        if self.max_wait_s is not None and self.deadline is not None:
            raise ValueError("give max_wait_s or deadline, not both")
        if self.deadline is not None and self.deadline.tzinfo is None:
            raise ValueError("deadline needs a time zone (e.g. 2026-12-05T18:00:00Z)")
        return self

    @model_validator(mode="after")
    def _inputs_fit_the_graph(self) -> VideoJob:
        nodes = [i.node for i in self.inputs]
        if len(set(nodes)) != len(nodes):
            raise ValueError("inputs: each image loader takes one input")
        for node in nodes:
            kind = self.graph.get(node, {}).get("class_type")
            if kind not in IMAGE_LOADERS:
                raise ValueError(
                    f"inputs: node {node!r} is not an image loader of the graph "
                    f"({'absent' if kind is None else kind})"
                )
        return self


def plan_json(plan: Plan) -> str:
    """`status --json`: the plan, with `uri` and `url` only on outputs kept in object storage,
    so a local output keeps the shape scripts read ({"path", "bytes", "sha256"})."""
    data = plan.model_dump(mode="json")
    for out in data["outputs"]:
        if out.get("uri") is None:
            out.pop("uri", None)
            out.pop("url", None)
    return json.dumps(data, indent=2, ensure_ascii=False)
