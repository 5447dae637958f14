"""Probes that ask while a read of a source is on its way share that read
(activities/shared_read.py): fifty jobs arriving behind a backlog parse ComfyUI's `/queue`
once, not fifty times. No probe gets an answer that finished before it asked."""

from __future__ import annotations

import asyncio

from activities.load_status import LoadStatusActivities
from spillway.sim.comfyui import ComfyUISim


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


async def test_a_probe_after_a_read_finished_reads_again_and_sees_the_change(
    http, comfyui_settings, comfyui: ComfyUISim, gpu
):
    acts = LoadStatusActivities(http, comfyui_settings(), gpu)
    comfyui.set_queue(pending=7)
    assert (await acts.probe()).queue_pending == 7
    comfyui.set_queue(pending=0)
    assert (await acts.probe()).queue_pending == 0


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
