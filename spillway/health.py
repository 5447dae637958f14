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
