"""Nobody's word but the pool's admits a job, and a pool's end costs the line seconds
(docs/design.md, "GPU admission"): on the real dev server with the worker, its agent and the
ComfyUI double, each way a message in a job's name or an ended pool could put two prompts on a
one-place card. The sampler reads what ComfyUI itself held."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.client import Client

from activities.comfyui.models import PLACE_TAKEN
from spillway.client import jobs as job_ops
from spillway.core import names
from spillway.core.gpu_pool import PoolAnswer, PoolAsk
from spillway.core.models import JobPlace, Plan, PriorityChange
from spillway.sim.comfyui import ComfyUISim
from tests.support.gpu_line import (
    posted,
    reset_to_after_its_admission,
    sampling,
    spillway_fixture,  # noqa: F401  (the `spillway` fixture)
    terminate_pool,
)
from tests.support.waiting import until

pytestmark = pytest.mark.full


async def _pending(comfyui: ComfyUISim, sw: Any, job: Any) -> str:
    """The job's prompt, once it waits in the paused ComfyUI."""
    plan = await sw.jobs.until(job, lambda p: p.prompt_id is not None)
    prompt = str(plan.prompt_id)
    await until(
        lambda: comfyui.state_of(prompt), lambda s: s == "pending", what=f"{prompt} pending"
    )
    return prompt


async def submits_refused(client: Client, job_id: str) -> int:
    """The job's submits that failed because the pool showed no place of its own."""
    refused = 0
    async for event in client.get_workflow_handle(job_id).fetch_history_events():
        failed = event.activity_task_failed_event_attributes
        refused += failed.failure.application_failure_info.type == PLACE_TAKEN
    return refused


async def _places_read(client: Client, pool_id: str) -> int:
    """The pool's reads of jobs' own places (a changed ask's confirmation) its run completed."""
    scheduled: dict[int, str] = {}
    done = 0
    async for event in client.get_workflow_handle(pool_id).fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            kind = event.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[event.event_id] = kind
        elif event.HasField("activity_task_completed_event_attributes"):
            started = event.activity_task_completed_event_attributes.scheduled_event_id
            done += scheduled.get(started) == names.POOL_READ_PLACES
    return done


async def test_an_answer_forged_to_a_waiting_job_posts_nothing_and_it_keeps_its_place_in_line(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.2
    comfyui.pause()  # the holder's prompt stays pending: its place stays held
    async with spillway(A40_MAX_JOBS=1) as sw, sampling(comfyui) as s:
        holder, nxt = await sw.holder_and_next()
        await _pending(comfyui, sw, holder)
        await sw.jobs.until(nxt, lambda plan: plan.queue is not None)
        # Anyone with signal rights: the job's ask time from its own query, and a place.
        place = await nxt.query(names.JOB_PLACE, result_type=JobPlace)
        assert place is not None
        forged = PoolAnswer(asked_at=place.asked_at, host="a40_local")
        await nxt.signal(names.POOL_ANSWER, forged)
        # Its submit finds no place of its own in the pool's memo: nothing is posted, and it
        # waits in line again with the same ask.
        await until(
            lambda: submits_refused(sw.client, nxt.id), what="the forged place's submit refused"
        )
        plan = await sw.jobs.until(nxt, lambda p: p.state == "queued" and p.queue is not None)
        assert plan.queue is not None and plan.queue.position == 1
        assert (plan.prompt_id, plan.local_attempts) == (None, 0)
        again = await nxt.query(names.JOB_PLACE, result_type=JobPlace)
        assert again is not None and (again.asked_at, again.host) == (place.asked_at, None)
        view = await sw.view()
        assert [p.job_id for h in view.hosts for p in h.places] == [holder.id]
        assert [i.job_id for i in view.line] == [nxt.id]
        assert s.most == 1
        comfyui.resume()
        plans = await asyncio.gather(holder.result(), nxt.result())
    assert [p.state for p in plans] == ["completed", "completed"]
    assert "place_taken=a40_local" in plans[1].reasons
    assert all(posted(comfyui, p) == 1 for p in plans)
    assert s.most == 1 and comfyui.most_held == 1


async def test_an_ask_forged_in_a_waiting_job_s_name_changes_none_of_its_request(
    spillway, comfyui: ComfyUISim
):
    """A priority, a mode and hosts of a forged ask with the job's own ask time change nothing
    (the job's own place does not show them); `spillway priority` still moves it at once."""
    comfyui.execution_s = 0.2
    comfyui.pause()
    async with spillway(A40_MAX_JOBS=1) as sw:
        holder, first = await sw.holder_and_next()
        second = await sw.start(cloud=False)
        await sw.line_is(lambda line: line == [first.id, second.id])
        pool_id = names.pool_id(sw.queue)
        before = await _places_read(sw.client, pool_id)
        place = await second.query(names.JOB_PLACE, result_type=JobPlace)
        assert place is not None
        forged = PoolAsk(
            job_id=second.id,
            asked_at=place.asked_at,
            priority=1,
            mode="headroom",
            unfit=["a40_local"],
        )
        await sw.client.get_workflow_handle(pool_id).signal(names.POOL_ASK, forged)

        async def settled() -> bool:
            read = await _places_read(sw.client, pool_id) > before
            return read or await sw.line() != [first.id, second.id]

        await until(settled, what="the pool's read of the job's own place, or a changed line")
        view = await sw.view()
        assert [(i.job_id, i.priority, i.mode) for i in view.line] == [
            (first.id, 3, "any"),
            (second.id, 3, "any"),
        ]
        change = PriorityChange(priority=1, by="bär", reason="the client's fix")
        spot = await job_ops.set_priority(sw.client, second.id, change)
        assert spot is not None and spot.position == 1
        assert await sw.line() == [second.id, first.id]
        comfyui.resume()
        plans = await asyncio.gather(*(h.result() for h in (holder, first, second)))
    assert [p.state for p in plans] == ["completed"] * 3
    assert plans[2].host == "a40_local" and comfyui.most_held == 1
    assert [c.priority for c in plans[2].priority_changes] == [1]


async def test_a_holder_terminated_after_its_pool_has_its_prompt_taken_out_before_the_next_posts(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.2
    comfyui.pause()
    async with (
        spillway(A40_MAX_JOBS=1, SPILLWAY_POOL_LINE_CHECK_S=3) as sw,
        sampling(comfyui) as s,
    ):
        holder, nxt = await sw.holder_and_next()
        prompt = await _pending(comfyui, sw, holder)
        # Its position reached it: it waits in line, checking every 3 s (an answer the pool
        # sent as it was terminated is dropped by the server, and the job asks again in 2 min).
        await sw.jobs.until(nxt, lambda plan: plan.queue is not None)
        await terminate_pool(sw)
        await holder.terminate(reason="operator")  # the same clean-up
        # The waiting job's line check starts a new pool; the one before it showed the holder
        # in its memo: its prompt leaves ComfyUI before the place goes to the next job.
        await sw.jobs.until(nxt, lambda p: p.prompt_id is not None)
        assert comfyui.state_of(prompt) == "unknown"  # deleted from its queue, never run
        assert s.most == 1
        comfyui.resume()
        plan = await nxt.result()
    assert plan.state == "completed" and posted(comfyui, plan) == 1
    assert s.most == 1 and comfyui.most_held == 1


async def test_a_job_reset_to_after_its_admission_while_no_pool_runs_posts_only_on_a_given_place(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.3
    async with spillway(A40_MAX_JOBS=1) as sw, sampling(comfyui) as s:
        done = await sw.start(cloud=False)
        first = await done.result()
        comfyui.pause()
        holder = await sw.start(cloud=False)
        await _pending(comfyui, sw, holder)
        await terminate_pool(sw)
        again = await reset_to_after_its_admission(sw.client, done.id)
        # Its submit finds no pool: it asks, which starts one. That pool counts the holder's
        # place (its predecessor's memo shows it), not the one the reset run replays.
        await sw.jobs.until(done.id, lambda p: p.state == "queued" and p.queue is not None)
        assert s.most == 1
        comfyui.resume()
        plans = await asyncio.gather(
            holder.result(),
            sw.client.get_workflow_handle(done.id, run_id=again, result_type=Plan).result(),
        )
    assert [p.state for p in plans] == ["completed", "completed"]
    assert "place_taken=a40_local" in plans[1].reasons
    assert posted(comfyui, first) == 1 and posted(comfyui, plans[1]) == 1
    assert s.most == 1 and comfyui.most_held == 1


async def test_after_a_pool_terminate_the_holder_s_give_back_starts_a_pool_that_admits_the_next(
    spillway, comfyui: ComfyUISim
):
    """No line check within the test's time (5 minutes by default): the give-back that finds
    no pool starts one, and the next job is admitted within seconds of the holder's end."""
    comfyui.execution_s = 0.2
    comfyui.pause()
    async with spillway(A40_MAX_JOBS=1) as sw:
        holder, nxt = await sw.holder_and_next()
        await sw.jobs.until(nxt, lambda plan: plan.queue is not None)
        ended = await terminate_pool(sw)
        comfyui.resume()
        await holder.result()
        clock = asyncio.get_running_loop().time
        since = clock()
        await sw.jobs.until(nxt, lambda p: p.prompt_id is not None, timeout_s=30)
        print(f"the next job posted {clock() - since:.2f} s after the holder's end")
        plan = await nxt.result()
        pool = await sw.client.get_workflow_handle(names.pool_id(sw.queue)).describe()
    assert plan.state == "completed" and posted(comfyui, plan) == 1
    assert pool.run_id != ended and comfyui.most_held == 1
