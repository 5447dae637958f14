"""routing_tiers.json: the video tiers (local GPU hosts via ComfyUI first, then the cloud
providers) and the meta entry that documents the load signal, validated when anything starts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spillway.core.settings import (
    CheckedUrl,
    is_loopback,
    read_config_file,
    shown,
    url_key,
)


class VideoTier(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    tier: Annotated[int, Field(ge=1, le=9)]
    # A local tier's name names its GPU host and its agent's task queue.
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")]
    # "comfyui" for a local tier (a GPU host), else a cloud provider's name
    # (activities/cloud/registry.py; CLOUD_PROVIDERS lists the ones tried).
    provider: Annotated[str, Field(pattern=r"^[a-z0-9_]+$")]
    location: Literal["local", "cloud"]
    description: str = ""
    enabled: bool = True
    # Planning figure per clip, keyed "<resolution>/<duration>s", e.g. "768P/6s".
    estimated_cost_usd: dict[str, Annotated[float, Field(ge=0, allow_inf_nan=False)]] = {}
    # A local tier is a GPU host (docs/design.md, "GPU hosts and agents"); unset fields come from
    # the environment's COMFYUI_URL, A40_GUARD_URL and A40_* when it is the only local tier.
    comfyui_url: CheckedUrl | None = None
    guard_url: CheckedUrl | None = None
    nvml_index: Annotated[int, Field(ge=0)] = 0
    vram_busy_pct: Annotated[float, Field(gt=0, le=100)] | None = None
    util_busy_pct: Annotated[float, Field(gt=0, le=100)] | None = None
    # How many of spillway's jobs the host holds at once (docs/design.md, "GPU admission");
    # unset: A40_MAX_JOBS.
    max_jobs: Annotated[int, Field(ge=1, le=1000)] | None = None
    # A render with no progress this long is stopped (docs/design.md); unset: RENDER_STALL_S.
    render_stall_s: Annotated[float, Field(ge=0, le=7 * 86400)] | None = None


class RoutingTiers(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    video_tiers: Annotated[list[VideoTier], Field(min_length=1)]
    meta: dict[str, Any] = {}

    @model_validator(mode="after")
    def _one_local_tier_and_unique_numbers(self) -> RoutingTiers:
        numbers = [t.tier for t in self.video_tiers]
        if len(numbers) != len(set(numbers)):
            raise ValueError(f"tier numbers must be unique, got {numbers}")
        local = [t for t in self.video_tiers if t.location == "local" and t.enabled]
        if not local:
            raise ValueError(
                "at least one enabled local tier (a GPU host running ComfyUI) is required"
            )
        if len(local) > 1 and any(t.comfyui_url is None for t in local):
            raise ValueError(
                "with several local tiers (GPU hosts) each needs its comfyui_url: "
                + ", ".join(t.name for t in local if t.comfyui_url is None)
            )
        names = [t.name for t in local]
        if len(names) != len(set(names)):
            raise ValueError(f"local tier names must be unique (they name GPU hosts), got {names}")
        shared = shared_comfyui([(t.name, t.comfyui_url) for t in local], loopback=False)
        if shared is not None:
            raise ValueError(f"{shared}: each GPU host needs a ComfyUI of its own")
        return self

    def by_provider(self, provider: str) -> VideoTier | None:
        return next((t for t in self.video_tiers if t.provider == provider and t.enabled), None)


def shared_comfyui(hosts: list[tuple[str, object]], *, loopback: bool) -> str | None:
    """Two of `hosts` (name, ComfyUI URL) at one ComfyUI, as a sentence naming both and the URL
    (without credentials); None: each has its own. Such hosts would each hand out the card's
    places: it would run twice the jobs it has places for. A loopback URL names the ComfyUI
    next to each host's agent, which may run on a machine of its own: two hosts at one are one
    ComfyUI only where their agents run on one machine (`loopback`)."""
    seen: dict[str, tuple[str, object]] = {}
    for name, url in hosts:
        if url is None or (is_loopback(url) and not loopback):
            continue
        first, first_url = seen.setdefault(url_key(url), (name, url))
        if first != name:
            return f"GPU hosts {first} and {name} share one ComfyUI ({shown(first_url)})"
    return None


def load_tiers(path: Path) -> RoutingTiers:
    return read_config_file(path, RoutingTiers, "routing tiers")
