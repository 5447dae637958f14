"""GPU hosts (docs/design.md, "GPU hosts and agents"): which host a job takes, when the GPUs count
as overloaded or unreachable, and how routing_tiers.json names the hosts."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from spillway.core.errors import ConfigError
from spillway.core.hosts import gpu_hosts, no_answer, pick_host, ref
from spillway.core.models import LoadStatus, Thresholds
from spillway.core.settings import PROJECT_ROOT, Settings
from spillway.core.tiers import load_tiers
from tests.support.settings import two_host_tiers

SEED = Thresholds(vram_busy_pct=85, util_busy_pct=95)
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def reading(
    vram: float = 42.4, pending: int = 0, running: int = 0, *, reachable: bool = True
) -> LoadStatus:
    overloaded = reachable and vram >= 85
    return LoadStatus(
        reachable=reachable,
        overloaded=overloaded,
        vram_pct=vram if reachable else None,
        queue_pending=pending,
        queue_running=running,
        reasons=[f"vram_used_{vram}pct_ge_85.0pct"] if overloaded else [],
        measured_at=NOW,
        thresholds=SEED,
    )


@pytest.mark.parametrize(
    ("readings", "host", "fallback", "reachable", "overloaded"),
    [
        ({"a": reading()}, "a", "a", True, False),
        ({"a": reading(vram=97)}, None, "a", True, True),
        ({"a": reading(vram=97), "b": reading()}, "b", "b", True, False),
        ({"a": reading(pending=3), "b": reading(running=1)}, "b", "b", True, False),
        ({"a": reading(vram=60), "b": reading(vram=40)}, "b", "b", True, False),
        ({"a": reading(vram=97, pending=5), "b": reading(vram=90)}, None, "b", True, True),
        ({"a": reading(reachable=False), "b": reading(vram=97)}, None, "b", True, True),
        ({"a": reading(reachable=False), "b": reading()}, "b", "b", True, False),
        ({"a": reading(reachable=False), "b": reading(reachable=False)}, None, None, False, False),
    ],
    ids=[
        "one free host",
        "one busy host",
        "the free one of two",
        "least backlog first",
        "then least VRAM used",
        "all busy: queue on the least busy",
        "unreachable and busy: overloaded",
        "unreachable and free: the free one",
        "none answers: unreachable",
    ],
)
def test_a_job_takes_the_host_with_headroom(readings, host, fallback, reachable, overloaded):
    choice = pick_host(readings)
    assert (choice.host, choice.fallback) == (host, fallback)
    assert (choice.load.reachable, choice.load.overloaded) == (reachable, overloaded)
    if len(readings) > 1:
        assert set(choice.load.hosts) == set(readings)  # every host's reading is kept


def test_reasons_name_the_host_when_every_host_is_busy():
    choice = pick_host({"a": reading(vram=97), "b": reading(vram=90)})
    assert choice.load.reasons == ["a:vram_used_97pct_ge_85.0pct", "b:vram_used_90pct_ge_85.0pct"]


def test_an_agent_that_did_not_answer_counts_as_unreachable_and_never_as_overloaded():
    load = no_answer("b", SEED, NOW, "activity ScheduleToStart timeout")
    assert (load.reachable, load.overloaded, load.host) == (False, False, "b")
    assert load.errors == ["agent of host b: activity ScheduleToStart timeout"]


def test_a_single_local_tier_without_urls_takes_the_seed_variables():
    settings = Settings(COMFYUI_URL="http://a40:8188", A40_GUARD_URL="http://a40:8189")
    [host] = gpu_hosts(settings, load_tiers(PROJECT_ROOT / "routing_tiers.json"))
    assert (host.name, host.comfyui_url, host.guard_url) == (
        "a40_local",
        "http://a40:8188/",
        "http://a40:8189/",
    )
    assert ref("spillway", host.name).task_queue == "spillway-gpu-a40_local"
    assert ref("spillway", host.name).waits_queue == "spillway-gpu-a40_local-waits"


def two_hosts(tmp_path: Path, **second: object) -> Path:
    second = {"comfyui_url": "http://gpu-b:8188", **second}
    return two_host_tiers(tmp_path, {"comfyui_url": "http://gpu-a:8188"}, second)


def test_several_local_tiers_are_several_hosts_with_their_own_settings(tmp_path):
    path = two_hosts(tmp_path, nvml_index=1, vram_busy_pct=70)
    hosts = gpu_hosts(Settings(), load_tiers(path))
    assert [(h.name, h.comfyui_url, h.nvml_index, h.vram_busy_pct) for h in hosts] == [
        ("a40_local", "http://gpu-a:8188/", 0, 85.0),
        ("gpu-b", "http://gpu-b:8188/", 1, 70.0),
    ]


def test_several_hosts_each_need_their_comfyui(tmp_path):
    with pytest.raises(ConfigError, match="each needs its comfyui_url: gpu-b"):
        load_tiers(two_hosts(tmp_path, comfyui_url=None))


def test_a_host_name_must_be_able_to_name_a_task_queue(tmp_path):
    with pytest.raises(ConfigError, match="name"):
        load_tiers(two_hosts(tmp_path, name="gpu b/../x"))
