"""`spillway load` and `spillway health`: the live load status and the whole trigger logic, the way
the seed's /health showed them. Never shows a key, only whether one is present."""

from __future__ import annotations

import httpx
from pydantic import BaseModel

from activities.load_status import LoadStatusActivities
from activities.nvml import NvmlReader
from spillway.models import LoadStatus
from spillway.settings import Settings
from spillway.tiers import RoutingTiers

TRIGGER = (
    "overloaded = VRAM busy OR (GPU util busy AND queue backlog) OR guard busy; "
    "a source that fails counts as not overloaded (fail-open)"
)
DECISION = [
    "ComfyUI reachable, not overloaded -> LOCAL",
    "reachable, overloaded, armed -> CLOUD (MiniMax)",
    "reachable, overloaded, not armed -> AWAIT approval (timeout or reject -> LOCAL)",
    "unreachable (confirmed twice), armed -> CLOUD (MiniMax)",
    "unreachable (confirmed twice), not armed -> AWAIT approval, else wait for ComfyUI",
]


class Source(BaseModel):
    name: str
    endpoint: str | None  # None: not configured, skipped
    rule: str


class CloudFallback(BaseModel):
    provider: str
    tier: int | None
    base_url: str
    fallback_enabled: bool
    key_present: bool
    armed: bool


class Approval(BaseModel):
    timeout_s: float
    recheck_s: float
    webhook_configured: bool


class Health(BaseModel):
    trigger: str
    sources: list[Source]
    probe_timeout_s: float
    unreachable_confirm_s: float
    cloud_fallback: CloudFallback
    approval: Approval
    decision: list[str]
    load: LoadStatus


async def probe_once(settings: Settings) -> LoadStatus:
    reader = NvmlReader()
    try:
        async with httpx.AsyncClient() as http:
            return await LoadStatusActivities(http, settings, reader).probe()
    finally:
        reader.close()


def health_report(settings: Settings, tiers: RoutingTiers, load: LoadStatus) -> Health:
    minimax = tiers.by_provider("minimax")
    return Health(
        trigger=TRIGGER,
        sources=[
            Source(
                name="comfyui_vram",
                endpoint=settings.comfyui("/system_stats"),
                rule=f"VRAM used >= {settings.A40_VRAM_BUSY_PCT:g}%",
            ),
            Source(
                name="gpu_util_and_queue",
                endpoint=f"NVML GPU {settings.A40_NVML_INDEX} + {settings.comfyui('/queue')}",
                rule=f"GPU util >= {settings.A40_UTIL_BUSY_PCT:g}% AND queue_pending >= 1",
            ),
            Source(name="a40_guard", endpoint=settings.guard_status_url(), rule="busy == true"),
        ],
        probe_timeout_s=settings.LOAD_PROBE_TIMEOUT_S,
        unreachable_confirm_s=settings.UNREACHABLE_CONFIRM_S,
        cloud_fallback=CloudFallback(
            provider="minimax",
            tier=minimax.tier if minimax else None,
            base_url=str(settings.MINIMAX_BASE_URL),
            fallback_enabled=settings.CLOUD_VIDEO_FALLBACK_ENABLED,
            key_present=settings.minimax_key_present,
            armed=settings.cloud_armed,
        ),
        approval=Approval(
            timeout_s=settings.APPROVAL_TIMEOUT_S,
            recheck_s=settings.APPROVAL_RECHECK_S,
            webhook_configured=settings.APPROVAL_WEBHOOK_URL is not None,
        ),
        decision=DECISION,
        load=load,
    )


def _pct(value: float | None) -> str:
    return "not measured" if value is None else f"{value:g}%"


def render_load(load: LoadStatus) -> str:
    verdict = "OVERLOADED" if load.overloaded else "not overloaded"
    reach = "reachable" if load.reachable else "UNREACHABLE"
    if load.queue_pending is None or load.queue_running is None:
        queue = "not measured"
    else:
        queue = f"{load.queue_running} running, {load.queue_pending} pending"
    if load.guard_busy is None:
        guard = "not measured"
    else:
        guard = f"busy (job {load.guard_job or 'unknown'})" if load.guard_busy else "free"
    lines = [
        f"A40 {verdict}; ComfyUI {reach}  (measured {load.measured_at:%Y-%m-%d %H:%M:%S} UTC)",
        f"  VRAM used  {_pct(load.vram_pct)}  (busy at >= {load.thresholds.vram_busy_pct:g}%)",
        f"  GPU util   {_pct(load.gpu_util_pct)}  "
        f"(busy at >= {load.thresholds.util_busy_pct:g}% with a pending queue)",
        f"  queue      {queue}",
        f"  guard      {guard}",
        "  reasons    " + (", ".join(load.reasons) or "none"),
    ]
    lines += ["  error      " + e for e in load.errors]
    return "\n".join(lines)


def render_health(health: Health) -> str:
    cloud, approval = health.cloud_fallback, health.approval
    yes = {True: "yes", False: "no"}
    lines = [f"Trigger: {health.trigger}"]
    for s in health.sources:
        lines.append(f"  {s.name:<20} {s.rule:<45} {s.endpoint or 'not configured: skipped'}")
    lines += [
        f"  each source answers within {health.probe_timeout_s:g}s or counts as failed; "
        f"'unreachable' needs a second probe {health.unreachable_confirm_s:g}s later",
        f"Cloud fallback: {cloud.provider} (tier {cloud.tier}) at {cloud.base_url}: "
        f"armed {yes[cloud.armed]} (CLOUD_VIDEO_FALLBACK_ENABLED {yes[cloud.fallback_enabled]}, "
        f"MINIMAX_API_KEY present {yes[cloud.key_present]})",
        f"Approval: waits {approval.timeout_s:g}s (then the job runs locally), re-probes every "
        f"{approval.recheck_s:g}s, webhook {'set' if approval.webhook_configured else 'not set'}",
        "Decision:",
        *(f"  {row}" for row in health.decision),
        "Load now:",
        render_load(health.load),
    ]
    return "\n".join(lines)
