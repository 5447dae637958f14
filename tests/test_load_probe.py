"""The fail-open load probe over real loopback HTTP (docs/design.md, "The load probe")."""

from __future__ import annotations

import time

import httpx
import pytest

from activities.probe.activities import LoadStatusActivities
from activities.probe.nvml import GpuReader, NvmlReader
from spillway.core.models import LoadStatus
from spillway.core.settings import Settings
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.guard import GUARD_STATUS_PATH, GuardSim
from spillway.sim.server import Fault
from tests.support.a40 import FakeGpu
from tests.support.constants import FREE_VRAM_PCT
from tests.support.waiting import until


async def probe(http: httpx.AsyncClient, settings: Settings, gpu: GpuReader) -> LoadStatus:
    return await LoadStatusActivities(http, settings, gpu).probe()


def errors_of(status: LoadStatus, source: str) -> list[str]:
    return [e for e in status.errors if e.startswith(f"{source}: ")]


# The seed's three verification cases.


async def test_free_a40_is_not_overloaded(http, comfyui_settings, guard: GuardSim, gpu: FakeGpu):
    status = await probe(http, comfyui_settings(A40_GUARD_URL=guard.url), gpu)
    assert status.reachable and not status.overloaded
    assert status.vram_pct == FREE_VRAM_PCT
    assert status.guard_busy is False
    assert status.reasons == [] and status.errors == []


async def test_vram_threshold_of_one_percent_overloads_with_the_vram_reason(
    http, comfyui_settings, gpu: FakeGpu
):
    status = await probe(http, comfyui_settings(A40_VRAM_BUSY_PCT=1), gpu)
    assert status.reachable and status.overloaded
    assert status.reasons == [f"vram_used_{FREE_VRAM_PCT}pct_ge_1.0pct"]


async def test_busy_guard_alone_overloads_whatever_vram_says(
    http, comfyui_settings, guard: GuardSim, gpu: FakeGpu
):
    guard.hold("sim_video_job_123")
    status = await probe(http, comfyui_settings(A40_GUARD_URL=guard.url), gpu)
    assert status.reachable and status.overloaded and status.guard_busy is True
    assert status.vram_pct == FREE_VRAM_PCT
    assert status.reasons == ["a40_guard_busy_job=sim_video_job_123"]
    assert status.guard_job == "sim_video_job_123"


async def test_busy_guard_naming_no_job_reports_job_unknown(
    http, comfyui_settings, guard: GuardSim, gpu: FakeGpu
):
    guard.status = {"busy": True}
    status = await probe(http, comfyui_settings(A40_GUARD_URL=guard.url), gpu)
    assert status.reasons == ["a40_guard_busy_job=unknown"]


# GPU utilisation counts only together with a backlog.


@pytest.mark.parametrize(
    ("util", "pending", "reasons"),
    [
        (97, 0, []),
        (97, 1, ["gpu_util_97pct_ge_95pct_queue_pending_1"]),
        (96.6, 2, ["gpu_util_97pct_ge_95pct_queue_pending_2"]),
        (94.9, 3, []),
        (95, 1, ["gpu_util_95pct_ge_95pct_queue_pending_1"]),
    ],
)
async def test_gpu_util_overloads_only_with_a_pending_queue(
    http, comfyui_settings, comfyui: ComfyUISim, gpu: FakeGpu, util, pending, reasons
):
    comfyui.set_queue(running=1, pending=pending)
    gpu.util_pct = util
    status = await probe(http, comfyui_settings(), gpu)
    assert status.reasons == reasons
    assert status.overloaded == bool(reasons)
    assert (status.gpu_util_pct, status.queue_pending, status.queue_running) == (util, pending, 1)


async def test_vram_at_exactly_the_threshold_is_overloaded(http, comfyui_settings, comfyui, gpu):
    comfyui.set_vram_used_pct(85)
    status = await probe(http, comfyui_settings(), gpu)
    assert status.reasons == ["vram_used_85.0pct_ge_85.0pct"]


async def test_all_three_sources_busy_list_every_reason(
    http, comfyui_settings, comfyui, guard, gpu
):
    comfyui.set_vram_used_pct(91.25)
    comfyui.set_queue(running=1, pending=2)
    gpu.util_pct = 99
    guard.hold("render-7")
    status = await probe(http, comfyui_settings(A40_GUARD_URL=guard.url), gpu)
    assert status.reasons == [
        "vram_used_91.2pct_ge_85.0pct",
        "gpu_util_99pct_ge_95pct_queue_pending_2",
        "a40_guard_busy_job=render-7",
    ]


# Fail-open: each source, broken while it alone would have said "overloaded", gives
# overloaded=false with that source's error listed.

ANSWERING_FAULTS: list[Fault] = ["http500", "garbage", "html"]
SILENT_FAULTS: list[Fault] = ["hang", "drop"]


@pytest.mark.parametrize("fault", ANSWERING_FAULTS + SILENT_FAULTS)
async def test_broken_system_stats_never_overloads(http, comfyui_settings, comfyui, gpu, fault):
    comfyui.set_vram_used_pct(99)
    comfyui.faults["/system_stats"] = fault
    status = await probe(http, comfyui_settings(), gpu)
    assert not status.overloaded
    assert len(errors_of(status, "system_stats")) == 1
    assert status.vram_pct is None
    # Any HTTP answer, even a 500 or garbage, means ComfyUI is there: reachable.
    assert status.reachable == (fault in ANSWERING_FAULTS)
    assert ("comfyui_unreachable" in status.reasons) == (not status.reachable)


@pytest.mark.parametrize(
    "answer",
    [
        {},
        {"devices": []},
        {"devices": [{"vram_total": "48318382080", "vram_free": 1}]},
        {"devices": [{"vram_total": 0, "vram_free": 0}]},
        {"devices": [{"vram_total": 100, "vram_free": 200}]},
        ["not", "an", "object"],
    ],
)
async def test_system_stats_with_missing_or_mistyped_fields_never_overloads(
    http, comfyui_settings, comfyui, gpu, answer
):
    comfyui.answers["/system_stats"] = answer
    status = await probe(http, comfyui_settings(A40_VRAM_BUSY_PCT=1), gpu)
    assert status.reachable and not status.overloaded
    assert len(errors_of(status, "system_stats")) == 1


@pytest.mark.parametrize("fault", ANSWERING_FAULTS + SILENT_FAULTS)
async def test_broken_queue_never_overloads(http, comfyui_settings, comfyui, gpu, fault):
    comfyui.set_queue(pending=3)
    gpu.util_pct = 99
    comfyui.faults["/queue"] = fault
    status = await probe(http, comfyui_settings(), gpu)
    assert status.reachable and not status.overloaded
    assert len(errors_of(status, "queue")) == 1
    assert status.queue_pending is None


@pytest.mark.parametrize("error", ["NVML error on GPU 0: Unknown Error", None])
async def test_broken_nvml_never_overloads(http, comfyui_settings, comfyui, gpu, error):
    comfyui.set_queue(pending=3)
    gpu.util_pct = 99
    if error is None:
        gpu.hang.set()
    else:
        gpu.error = error
    status = await probe(http, comfyui_settings(), gpu)
    assert status.reachable and not status.overloaded
    assert len(errors_of(status, "nvml")) == 1
    assert status.gpu_util_pct is None and status.queue_pending == 3


@pytest.mark.parametrize("fault", ANSWERING_FAULTS + SILENT_FAULTS)
async def test_broken_guard_never_overloads(http, comfyui_settings, guard, gpu, fault):
    guard.hold("would-block")
    guard.faults[GUARD_STATUS_PATH] = fault
    status = await probe(http, comfyui_settings(A40_GUARD_URL=guard.url), gpu)
    assert status.reachable and not status.overloaded
    assert len(errors_of(status, "guard")) == 1
    assert status.guard_busy is None


@pytest.mark.parametrize(
    "answer",
    [{"busy": "yes"}, {"busy": 1}, {"busy": None}, {"job": "x"}, {}, [True], "busy"],
)
async def test_guard_busy_must_be_a_json_boolean(http, comfyui_settings, guard, gpu, answer):
    guard.status = answer
    status = await probe(http, comfyui_settings(A40_GUARD_URL=guard.url), gpu)
    assert not status.overloaded and status.guard_busy is None
    assert len(errors_of(status, "guard")) == 1


async def test_refused_guard_never_overloads(http, comfyui_settings, gpu, refused_url):
    status = await probe(http, comfyui_settings(A40_GUARD_URL=refused_url), gpu)
    assert status.reachable and not status.overloaded
    assert len(errors_of(status, "guard")) == 1


async def test_unset_guard_url_skips_the_guard_without_an_error(http, comfyui_settings, gpu):
    status = await probe(http, comfyui_settings(A40_GUARD_URL=""), gpu)
    assert status.guard_busy is None and status.errors == []


# Reachability: only "no answer at all" is unreachable.


async def test_comfyui_refusing_connections_is_unreachable_not_overloaded(
    http, comfyui_settings, comfyui, gpu
):
    await comfyui.stop()
    status = await probe(http, comfyui_settings(), gpu)
    assert not status.reachable and not status.overloaded
    assert status.reasons == ["comfyui_unreachable"]
    assert len(errors_of(status, "system_stats")) == 1 and len(errors_of(status, "queue")) == 1


async def test_comfyui_coming_back_after_a_restart_is_reachable_again(
    http, comfyui_settings, comfyui, gpu
):
    settings = comfyui_settings()
    await comfyui.stop()
    assert not (await probe(http, settings, gpu)).reachable
    await comfyui.start()
    assert (await probe(http, settings, gpu)).reachable


async def test_every_source_hanging_still_answers_within_the_timeout(
    http, comfyui_settings, comfyui, guard, gpu
):
    comfyui.faults["*"] = "hang"
    guard.faults["*"] = "hang"
    gpu.hang.set()
    settings = comfyui_settings(A40_GUARD_URL=guard.url, LOAD_PROBE_TIMEOUT_S=1.0)
    started = time.monotonic()
    status = await probe(http, settings, gpu)
    elapsed = time.monotonic() - started
    # Concurrent sources: about one timeout in all; one after another would take four.
    assert elapsed < 2.0, f"probe took {elapsed:.2f}s"
    assert not status.reachable and not status.overloaded
    assert sorted(e.split(":")[0] for e in status.errors) == [
        "guard",
        "nvml",
        "queue",
        "system_stats",
    ]


# NVML absent (as on this machine): the probe still answers and names the problem once.


async def test_probe_without_nvml_answers_and_lists_the_nvml_error_once(http, comfyui_settings):
    reader = NvmlReader()
    status = await probe(http, comfyui_settings(), reader)
    assert status.reachable and not status.overloaded and status.vram_pct == FREE_VRAM_PCT
    nvml = errors_of(status, "nvml")
    assert len(nvml) == 1 and "Traceback" not in nvml[0]
    assert status.gpu_util_pct is None


# A hung NVML: its own thread, never the shared pool, and never a queue of reads behind it.


async def test_a_hung_nvml_holds_one_thread_of_its_own_and_later_probes_fail_fast(
    http, comfyui_settings, comfyui, gpu: FakeGpu
):
    gpu.hang.set()
    settings = comfyui_settings(LOAD_PROBE_TIMEOUT_S=0.3)
    first = await probe(http, settings, gpu)
    assert errors_of(first, "nvml") == ["nvml: no reading within 0.3s"]

    later = [await probe(http, settings, gpu) for _ in range(3)]
    for status in later:  # none waited for the hung read: that would say "no reading within"
        [nvml] = errors_of(status, "nvml")
        assert nvml.startswith("nvml: still busy")
        assert status.reachable and not status.overloaded and status.gpu_util_pct is None
    assert gpu.read_threads == ["nvml"]  # one read, on NVML's thread, not the shared pool's

    gpu.released.set()  # the driver answers again: the next probe reads
    status = await until(lambda: probe(http, settings, gpu), lambda s: s.gpu_util_pct == 10.0)
    assert errors_of(status, "nvml") == []


async def test_an_unexpected_nvml_exception_fails_open_in_one_line(
    http, comfyui_settings, comfyui, gpu: FakeGpu
):
    comfyui.set_queue(running=1, pending=3)
    gpu.util_pct = 99
    gpu.crash = OSError("GPU is lost\n  at nvml.c:42")
    status = await probe(http, comfyui_settings(), gpu)
    assert not status.overloaded and status.gpu_util_pct is None
    assert errors_of(status, "nvml") == ["nvml: OSError: GPU is lost at nvml.c:42"]
