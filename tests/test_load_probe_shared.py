"""Probes that ask while a read of a source is on its way share that read, and a good `/queue`
answer serves the probes of the next moment (activities/shared_read.py, QUEUE_REUSE_S): fifty
jobs arriving behind a backlog parse ComfyUI's `/queue` a few times, not fifty. Reachability,
the guard and failures are always read anew."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from activities.probe import activities as load_status
from activities.probe.activities import LoadStatusActivities
from spillway.core.models import LoadStatus
from spillway.sim.comfyui import ComfyUISim
from tests.support.constants import BUSY_VRAM_PCT


async def test_probes_asking_together_share_one_read_of_each_source(
    http, comfyui_settings, comfyui: ComfyUISim, gpu
):
    comfyui.set_queue(pending=7)
    acts = LoadStatusActivities(http, comfyui_settings(), gpu)
    before = comfyui.hits["GET /queue"], comfyui.hits["GET /system_stats"]
    statuses = await asyncio.gather(*(acts.probe() for _ in range(10)))
    assert all(s.queue_pending == 7 and s.errors == [] for s in statuses)
    assert (comfyui.hits["GET /queue"], comfyui.hits["GET /system_stats"]) == (
        before[0] + 1,
        before[1] + 1,
    )


@pytest.fixture
def probe_twice(http, comfyui_settings, comfyui: ComfyUISim, gpu, monkeypatch):
    """Probes with 7 prompts pending, lets `change` happen (and `pause_s` pass), probes again;
    a good `/queue` answer serves for `reuse_s`."""

    async def run(
        reuse_s: float, change: Callable[[], object], pause_s: float = 0.0
    ) -> tuple[LoadStatus, LoadStatus]:
        monkeypatch.setattr(load_status, "QUEUE_REUSE_S", reuse_s)
        acts = LoadStatusActivities(http, comfyui_settings(), gpu)
        comfyui.set_queue(pending=7)
        first = await acts.probe()
        change()
        await asyncio.sleep(pause_s)
        return first, await acts.probe()

    return run


async def test_a_good_queue_answer_serves_the_probes_of_the_next_moment_and_nothing_else(
    probe_twice, comfyui: ComfyUISim
):
    def emptied_and_busy() -> None:
        comfyui.set_queue(pending=0)
        comfyui.set_vram_used_pct(BUSY_VRAM_PCT)

    stats = comfyui.hits["GET /system_stats"]
    first, again = await probe_twice(30.0, emptied_and_busy)
    assert first.queue_pending == again.queue_pending == 7  # the queue of a moment ago
    assert again.vram_pct == BUSY_VRAM_PCT and comfyui.hits["GET /system_stats"] == stats + 2


async def test_after_the_moment_a_probe_reads_the_queue_again_and_sees_the_change(
    probe_twice, comfyui: ComfyUISim
):
    first, again = await probe_twice(0.05, lambda: comfyui.set_queue(pending=0), pause_s=0.1)
    assert (first.queue_pending, again.queue_pending) == (7, 0)


async def test_a_failed_queue_read_is_never_handed_to_a_later_probe(
    probe_twice, comfyui: ComfyUISim
):
    comfyui.faults["/queue"] = "http500"
    first, again = await probe_twice(30.0, lambda: comfyui.faults.pop("/queue"))
    assert (first.queue_pending, again.queue_pending) == (None, 7)


async def test_probes_sharing_a_hung_read_each_give_up_within_their_bound(
    http, comfyui_settings, comfyui: ComfyUISim, gpu
):
    comfyui.faults["/queue"] = "hang"
    acts = LoadStatusActivities(http, comfyui_settings(LOAD_PROBE_TIMEOUT_S=0.5), gpu)
    first = asyncio.ensure_future(acts.probe())
    await asyncio.sleep(0.3)  # the second joins the first's read halfway through
    second = await acts.probe()
    for status in (await first, second):
        assert not status.overloaded and status.queue_pending is None
        assert [e for e in status.errors if e.startswith("queue: ")] == [
            f"queue: no answer from {comfyui.url}/queue within 0.5s"
        ]
