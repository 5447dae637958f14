"""The GPU hosts and the policy the workers decide with: a host's load reading, how a job reaches
a host, the configuration that decides routes, and what `spillway health` shows.

Like spillway/models.py, everything here travels through Temporal's history with the pydantic
data converter, so it must never hold a secret.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from spillway.decision import is_armed


class Thresholds(BaseModel):
    model_config = ConfigDict(frozen=True)

    vram_busy_pct: float
    util_busy_pct: float


class LoadProbeRequest(BaseModel):
    """Input of `a40_load_status`; the job id only labels the measurement in logs."""

    job_id: str | None = None


class LoadStatus(BaseModel):
    """One measurement of the A40's load (docs/design.md, "The load probe").

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
    comfyui_max_attempts: int
    webhook_configured: bool
    ui_url: str
    await_loops_per_run: int
    heartbeat_timeout_s: float = 30.0  # absent from histories recorded before it existed
    simulated: bool = False  # decided by a `spillway dev --simulate` worker
    # The GPU hosts; empty in histories from before hosts existed: then the job's own task queue.
    hosts: list[HostRef] = []
    # The cloud providers with keys, in CLOUD_PROVIDERS order; empty before Kling: MiniMax only.
    providers: list[str] = []
    job_webhook_configured: bool = False  # JOB_WEBHOOK_URL: every job's completion is posted
    estimated_costs_usd: dict[str, float] = {}  # MiniMax tier, "768P/6s" -> USD

    def armed_for(self, job_has_cloud_request: bool) -> bool:
        return is_armed(self.fallback_enabled, self.key_present, job_has_cloud_request)


class HostView(BaseModel):
    """One GPU host as `spillway health` shows it: the reading its agent gave, or why none."""

    name: str
    task_queue: str
    load: LoadStatus | None = None
    error: str | None = None  # e.g. no agent picked the probe up


class WorkersView(BaseModel):
    """What the workers see (docs/design.md, "GPU hosts and agents"): the policy in force on
    them and a probe of every host, run on the hosts' own task queues."""

    policy: Policy
    hosts: list[HostView]


class PolicyRequest(BaseModel):
    job_id: str
