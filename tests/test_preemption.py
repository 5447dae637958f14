"""Preemption on the real dev server with the worker, its agent and the ComfyUI double
(docs/design.md, "Preemption"; SPILLWAY_PREEMPT=priority): an urgent job takes the place of a
batch render, whose prompt is out of ComfyUI before the urgent one is posted, and which renders
again after it; and the recovery paths, in each of which the place goes to exactly one job. The
sampler reads what ComfyUI itself held every 10 ms: never more prompts than places."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.client import WorkflowHandle

from activities.comfyui.models import prompt_id_for
from spillway.cli.render import render_plan, render_queue
from spillway.core import names
from spillway.core.gpu_pool import PoolInput
from spillway.core.models import Plan
from spillway.sim.comfyui import ComfyUISim
from tests.support.gpu_line import (
    Spillway,
    sampling,
    spillway_fixture,  # noqa: F401  (the `spillway` fixture)
)
from tests.support.waiting import until
from workflows.texts import current_details, pool_details

pytestmark = pytest.mark.full

PREEMPT = {"A40_MAX_JOBS": 1, "SPILLWAY_PREEMPT": "priority"}


async def _rendering(comfyui: ComfyUISim, sw: Spillway, job: WorkflowHandle[Any, Plan]) -> str:
    """The job's prompt, once ComfyUI runs it."""
    plan = await sw.jobs.until(job, lambda p: p.prompt_id is not None)
    prompt = str(plan.prompt_id)
    await until(
        lambda: comfyui.state_of(prompt), lambda s: s == "running", what=f"{prompt} running"
    )
    return prompt


async def _told(sw: Spillway, victim: str, by: str) -> None:
    """The pool told `victim` to give its place to `by`."""

    async def giving() -> list[tuple[str, str | None]]:
        return [(p.job_id, p.preempted_by) for h in (await sw.view()).hosts for p in h.places]

    await until(giving, lambda held: (victim, by) in held, what=f"{victim} told to let go")


async def _submits(sw: Spillway, job_id: str) -> int:
    """The ComfyUI submits the job's history scheduled."""
    found = 0
    async for event in sw.client.get_workflow_handle(job_id).fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            kind = event.activity_task_scheduled_event_attributes.activity_type.name
            found += kind == names.COMFYUI_SUBMIT
    return found


def _interrupted(comfyui: ComfyUISim, prompt_id: str) -> bool:
    entry = comfyui.history.get(prompt_id)
    messages = entry["status"]["messages"] if entry else []
    return any(kind == "execution_interrupted" for kind, _ in messages)


async def test_an_urgent_job_takes_a_batch_render_s_place_which_renders_again_after_it(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 3.0  # the urgent render: long enough to be seen running
    comfyui.stall_next = 1  # the batch render runs until it is interrupted, however slow the day
    async with spillway(**PREEMPT) as sw, sampling(comfyui) as s:
        batch = await sw.start(cloud=False, priority=5)
        first = await _rendering(comfyui, sw, batch)
        urgent = await sw.start(cloud=False, priority=1)
        waiting = await sw.jobs.until(batch, lambda p: p.state == "queued" and p.preempted)
        assert waiting.preempted is not None and waiting.preempted.by == urgent.id
        assert waiting.preempted.host == "a40_local"
        assert f"preempted_by_{urgent.id}" in waiting.reasons
        await sw.jobs.until(urgent, "running_local")
        assert comfyui.state_of(first) != "running"
        view = await sw.view()
        assert [(i.job_id, i.preempted_by) for i in view.line] == [(batch.id, urgent.id)]
        assert view.line[0].state == "queued"
        assert view.preemptions == 1
        assert f"preempted by {urgent.id}" in render_queue(view)
        assert "preemptions since the pool started: 1" in render_queue(view)
        assert f"preempted by {urgent.id} on a40_local at " in render_plan(waiting)
        assert "**Preemptions: 1**" in pool_details(view, len(view.line))
        assert f"**Preempted** by `{urgent.id}`" in current_details(waiting)
        comfyui.execution_s = 0.5
        urgent_plan, batch_plan = await asyncio.gather(urgent.result(), batch.result())
    assert (urgent_plan.state, batch_plan.state) == ("completed", "completed")
    assert batch_plan.route == "local" and batch_plan.outputs
    # Its interrupted render is not its result: a second prompt, named in its history.
    assert _interrupted(comfyui, first)
    assert batch_plan.prompt_id != first and batch_plan.local_attempts == 2
    assert batch_plan.prompt_id == prompt_id_for(batch.id, 2, first.split("-")[-2])
    assert await _submits(sw, batch.id) == 2
    assert comfyui.prompt_posts[first] == comfyui.prompt_posts[str(batch_plan.prompt_id)] == 1
    assert f"preempted_by_{urgent.id}" in batch_plan.reasons
    assert s.most == 1 and comfyui.most_held == 1


async def test_a_job_one_priority_step_lower_or_with_preemption_off_is_never_preempted(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 2.0
    for overrides in ({"SPILLWAY_PREEMPT": "off"}, {"SPILLWAY_PREEMPT": "priority"}):
        async with spillway(A40_MAX_JOBS=1, **overrides) as sw:
            batch = await sw.start(cloud=False, priority=5 if "off" in overrides.values() else 3)
            await _rendering(comfyui, sw, batch)
            urgent = await sw.start(
                cloud=False, priority=2 if "off" not in overrides.values() else 1
            )
            plans = await asyncio.gather(batch.result(), urgent.result())
        assert [p.preempted for p in plans] == [None, None]
        assert [p.local_attempts for p in plans] == [1, 1]


async def test_the_preemptor_cancelled_while_the_victim_lets_go_leaves_the_place_to_the_line(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 30.0  # nodes of 10 s: the interrupt takes a while to act
    async with spillway(**PREEMPT) as sw, sampling(comfyui) as s:
        batch = await sw.start(cloud=False, priority=5)
        first = await _rendering(comfyui, sw, batch)
        urgent = await sw.start(cloud=False, priority=1)
        await _told(sw, batch.id, urgent.id)
        comfyui.execution_s = 0.5
        await urgent.cancel()
        batch_plan = await batch.result()
        urgent_state = (await sw.jobs.status(urgent.id)).state
        view = await sw.settled()
    assert urgent_state == "cancelled"
    assert batch_plan.state == "completed" and batch_plan.local_attempts == 2
    assert _interrupted(comfyui, first)
    assert s.most == 1 and comfyui.most_held == 1
    assert view.line == [] and all(not h.places for h in view.hosts)


async def test_the_pool_continuing_as_new_mid_preemption_hands_the_place_to_the_preemptor(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.5
    comfyui.stall_next = 1  # the batch render runs until it is interrupted
    async with spillway(**PREEMPT) as sw, sampling(comfyui) as s:
        # A pool that ends its run every 3 signals: the preemption spans several runs.
        await sw.client.start_workflow(
            names.GPU_POOL,
            PoolInput(signals_per_run=3),
            id=names.pool_id(sw.queue),
            task_queue=names.pool_queue(sw.queue),
        )
        batch = await sw.start(cloud=False, priority=5)
        first = await _rendering(comfyui, sw, batch)
        urgent = await sw.start(cloud=False, priority=1)
        # One step above the batch job: they wait their turn, never preempt it.
        others = [await sw.start(cloud=False, priority=4) for _ in range(3)]
        plans = await asyncio.gather(*(h.result() for h in (urgent, batch, *others)))
        runs = 0
        async for _ in sw.client.list_workflows(f"WorkflowId = '{names.pool_id(sw.queue)}'"):
            runs += 1
    assert all(p.state == "completed" for p in plans)
    assert plans[1].preempted is not None and plans[1].preempted.by == urgent.id
    assert _interrupted(comfyui, first)
    # The urgent job rendered first after the batch job let go: before the others in line.
    assert comfyui.history[str(plans[0].prompt_id)]["prompt"][0] < min(
        comfyui.history[str(p.prompt_id)]["prompt"][0] for p in plans[2:]
    )
    assert s.most == 1 and comfyui.most_held == 1
    assert runs >= 3


async def test_comfyui_restarted_mid_preemption_gives_the_place_to_exactly_one_job(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 30.0
    async with spillway(**PREEMPT) as sw, sampling(comfyui) as s:
        batch = await sw.start(cloud=False, priority=5)
        await _rendering(comfyui, sw, batch)
        urgent = await sw.start(cloud=False, priority=1)
        await _told(sw, batch.id, urgent.id)
        comfyui.execution_s = 0.5
        await comfyui.restart(down_s=1.0)
        urgent_plan, batch_plan = await asyncio.gather(urgent.result(), batch.result())
    assert (urgent_plan.state, batch_plan.state) == ("completed", "completed")
    assert batch_plan.preempted is not None and batch_plan.local_attempts == 2
    assert s.most == 1 and comfyui.most_held == 1
