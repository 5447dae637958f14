"""GPU hosts (docs/design.md, "GPU hosts and agents"): where each measurement and each render
happens, which task queues reach them, and which host a job takes. Pure: the workflow picks a
host with `pick_host`, the worker and `spillway agent` build their workers from `gpu_hosts`.

Every local tier of routing_tiers.json is a host. A file with a single local tier that names no
ComfyUI takes it from the environment (COMFYUI_URL, A40_GUARD_URL, A40_*): the seed's variables
describe a one-GPU set-up completely.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel

from spillway.core.models import HostRef, LoadStatus, Thresholds
from spillway.core.settings import Settings, url_key
from spillway.core.tiers import RoutingTiers

WAITS_SUFFIX = "-waits"
UNREACHABLE = "comfyui_unreachable"  # the reason code of a host that gave no answer


class GpuHost(BaseModel):
    name: str
    comfyui_url: str
    guard_url: str | None = None
    nvml_index: int = 0
    vram_busy_pct: float = 85.0
    util_busy_pct: float = 95.0
    max_jobs: int = 2
    render_stall_s: float = 900.0


def host_queue(task_queue: str, host: str) -> str:
    return f"{task_queue}-gpu-{host}"


def ref(task_queue: str, host: str, max_jobs: int = 2, comfyui_url: str | None = None) -> HostRef:
    queue = host_queue(task_queue, host)
    return HostRef(
        name=host,
        task_queue=queue,
        waits_queue=queue + WAITS_SUFFIX,
        max_jobs=max_jobs,
        comfyui=url_key(comfyui_url) if comfyui_url is not None else None,
    )


def gpu_hosts(settings: Settings, tiers: RoutingTiers) -> list[GpuHost]:
    local = [t for t in tiers.video_tiers if t.location == "local" and t.enabled]
    if len(local) == 1 and local[0].comfyui_url is None:
        return [
            GpuHost(
                name=local[0].name,
                comfyui_url=str(settings.COMFYUI_URL),
                guard_url=str(settings.A40_GUARD_URL) if settings.A40_GUARD_URL else None,
                nvml_index=settings.A40_NVML_INDEX,
                vram_busy_pct=settings.A40_VRAM_BUSY_PCT,
                util_busy_pct=settings.A40_UTIL_BUSY_PCT,
                max_jobs=local[0].max_jobs or settings.A40_MAX_JOBS,
                render_stall_s=_stall(local[0].render_stall_s, settings),
            )
        ]
    return [
        GpuHost(
            name=t.name,
            comfyui_url=str(t.comfyui_url),
            guard_url=str(t.guard_url) if t.guard_url else None,
            nvml_index=t.nvml_index,
            vram_busy_pct=t.vram_busy_pct or settings.A40_VRAM_BUSY_PCT,
            util_busy_pct=t.util_busy_pct or settings.A40_UTIL_BUSY_PCT,
            max_jobs=t.max_jobs or settings.A40_MAX_JOBS,
            render_stall_s=_stall(t.render_stall_s, settings),
        )
        for t in local
    ]


def _stall(tier: float | None, settings: Settings) -> float:
    return settings.RENDER_STALL_S if tier is None else tier


def host_settings(settings: Settings, host: GpuHost) -> Settings:
    """The settings an agent's activities read: the host's ComfyUI, guard, GPU and thresholds."""
    return settings.model_copy(
        update={
            "COMFYUI_URL": host.comfyui_url,
            "A40_GUARD_URL": host.guard_url,
            "A40_NVML_INDEX": host.nvml_index,
            "A40_VRAM_BUSY_PCT": host.vram_busy_pct,
            "A40_UTIL_BUSY_PCT": host.util_busy_pct,
            "RENDER_STALL_S": host.render_stall_s,
        }
    )


@dataclass(frozen=True)
class HostChoice:
    """The host with headroom a job takes (None: no host has any), the host it queues on when it
    runs locally anyway (a rejected or timed-out approval: the reachable one with the least
    backlog), and the reading the decision sees: reachable when any host answered, overloaded
    only when every host that answered is."""

    host: str | None
    fallback: str | None
    load: LoadStatus


def pick_host(readings: dict[str, LoadStatus]) -> HostChoice:
    """Among hosts with headroom the least backlog (pending + running), then the least VRAM
    used, then the name; a reading that failed to measure counts as no backlog (fail-open)."""
    free = [
        (name, load)
        for name, load in sorted(readings.items())
        if load.reachable and not load.overloaded
    ]
    if free:
        name, load = min(free, key=_order)
        return HostChoice(name, name, _combined(readings, load))
    reachable = [(n, r) for n, r in sorted(readings.items()) if r.reachable]
    if reachable:
        name, load = min(reachable, key=_order)
        return HostChoice(None, name, _combined(readings, load))
    return HostChoice(None, None, _combined(readings, sorted(readings.items())[0][1]))


def no_answer(host: str, thresholds: Thresholds, now: datetime, why: str) -> LoadStatus:
    """A probe whose agent did not answer: unreachable for this probe, and never overloaded."""
    return LoadStatus(
        reachable=False,
        overloaded=False,
        reasons=[UNREACHABLE],
        errors=[f"agent of host {host}: {why}"],
        measured_at=now,
        thresholds=thresholds,
        host=host,
    )


def _order(item: tuple[str, LoadStatus]) -> tuple[int, float]:
    return _backlog(item[1]), item[1].vram_pct or 0.0


def _backlog(load: LoadStatus) -> int:
    return (load.queue_pending or 0) + (load.queue_running or 0)


def _combined(readings: dict[str, LoadStatus], shown: LoadStatus) -> LoadStatus:
    if len(readings) == 1:
        return shown
    reachable = [r for r in readings.values() if r.reachable]
    overloaded = bool(reachable) and all(r.overloaded for r in reachable)
    reasons = [f"{name}:{reason}" for name, r in sorted(readings.items()) for reason in r.reasons]
    errors = [f"{name}:{error}" for name, r in sorted(readings.items()) for error in r.errors]
    return shown.model_copy(
        update={
            "reachable": bool(reachable),
            "overloaded": overloaded,
            "reasons": reasons if overloaded or not reachable else [],
            "errors": errors,
            "hosts": dict(sorted(readings.items())),
        }
    )
