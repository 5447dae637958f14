"""GPU admission end to end (docs/design.md, "GPU admission"): the worker with its agent on the real
dev server, the ComfyUI double rendering for a while, the MiniMax double for the cloud. A sampler
reads the double's queue all along, so "never more than max_jobs in ComfyUI" is what ComfyUI
itself held, not what spillway thinks it sent."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from spillway.client import jobs as job_ops
from spillway.core import names
from spillway.core.gpu_pool import PoolAsk, PoolInput, PoolLeave
from spillway.core.models import Plan
from spillway.core.pool_holders import LEAVE_CHECKS
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.support.cli import spillway as cli
from tests.support.gpu_line import (
    admitted_asks,
    checks_done,
    posted,
    reset_to_after_its_admission,
    sampling,
    spillway_fixture,  # noqa: F401  (the `spillway` fixture)
    terminate_pool,
)
from tests.support.graphs import VIDEO_GRAPH
from tests.support.jobs import reset_to_first_workflow_task
from tests.support.settings import two_host_tiers
from tests.support.waiting import until

pytestmark = pytest.mark.full


ARMED = {"CLOUD_VIDEO_FALLBACK_ENABLED": True}  # the MiniMax double's key is there


def interruptible_at_every_second(sim: ComfyUISim) -> None:
    """A long render that an interrupt stops within a second, as a sampler's steps do (ComfyUI
    looks for one before each node and at every sampler step)."""
    sim.progress_nodes |= {node["class_type"] for node in VIDEO_GRAPH.values()}
    sim.progress_steps = round(sim.execution_s / len(VIDEO_GRAPH))


async def test_an_armed_burst_at_an_idle_gpu_fills_the_places_and_overflows_to_the_cloud(
    spillway, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    comfyui.execution_s = 2.0
    async with spillway(**ARMED) as sw, sampling(comfyui) as s:
        handles = await asyncio.gather(*(sw.start() for _ in range(8)))
        plans = await asyncio.gather(*(h.result() for h in handles))
    local = [p for p in plans if p.route == "local"]
    cloud = [p for p in plans if p.route == "cloud"]
    assert s.most <= 2
    assert len(local) + len(cloud) == 8 and len(local) >= 2 and len(cloud) >= 4
    assert all(p.state == "completed" for p in plans)
    assert all(
        any(r.startswith("gpu_places_full_a40_local_2of2") for r in p.reasons) for p in cloud
    )
    assert sum(minimax.create_calls_by_prompt.values()) == len(cloud)  # one create each
    assert all(posted(comfyui, p) == 1 for p in local)


async def test_local_only_jobs_wait_in_line_with_positions_and_run_in_line_order(
    spillway, comfyui: ComfyUISim
):
    async with spillway() as sw, sampling(comfyui) as s:
        handles = await asyncio.gather(*(sw.start(cloud=False) for _ in range(6)))
        line = await sw.line_is(lambda line: len(line) == 4)
        for position, job_id in enumerate(line, 1):
            plan = await sw.jobs.until(job_id, "queued")
            assert plan.queue is not None and plan.queue.position == position
        plans = {p.job_id: p for p in await asyncio.gather(*(h.result() for h in handles))}
    assert s.most <= 2
    assert all(p.state == "completed" and p.route == "local" for p in plans.values())
    assert all(posted(comfyui, p) == 1 for p in plans.values())
    order = list(comfyui.prompt_posts)
    assert [order.index(plans[j].prompt_id) for j in line] == [2, 3, 4, 5]


async def test_a_priority_1_job_behind_three_queued_ones_runs_next(
    spillway, comfyui: ComfyUISim, cli_env, dev_env
):
    comfyui.execution_s = 2.0
    async with spillway(A40_MAX_JOBS=1) as sw:
        holder = await sw.start(cloud=False)
        await sw.jobs.until(holder, "running_local")
        waiting = []
        for n in range(1, 4):  # one after another: the line is in the order the jobs asked
            waiting.append(await sw.start(cloud=False))
            await sw.line_is(lambda line, n=n: len(line) == n)
        urgent = await sw.start(cloud=False, priority=1)
        assert (await sw.line_is(lambda line: len(line) == 4))[0] == urgent.id
        # What an operator sees: the CLI's queue, as text and JSON, and the queued jobs' list.
        for job in waiting:
            await sw.jobs.until(job, "queued")
        env = cli_env(
            TEMPORAL_ADDRESS=dev_env.client.service_client.config.target_host,
            SPILLWAY_TASK_QUEUE=sw.queue,
        )
        code, out, err = await cli("queue", env=env)
        assert code == 0, err
        assert "a40_local: 1 of 1 in use" in out
        assert max(len(line) for line in out.splitlines()) <= 100
        head = next(line for line in out.splitlines() if line.startswith("     1  "))
        assert urgent.id[:31] in head and "places taken (a40_local 1/1)" in head
        code, out, err = await cli("queue", "--json", env=env)
        shown = json.loads(out)
        assert [p["job_id"] for p in shown["hosts"][0]["places"]] == [holder.id]
        assert [i["job_id"] for i in shown["line"]] == [urgent.id, *(w.id for w in waiting)]
        code, out, err = await cli("list", "--state", "queued", "--json", env=env)
        assert {j["job_id"] for j in json.loads(out)} >= {w.id for w in waiting}
        plans = await asyncio.gather(*(h.result() for h in [holder, urgent, *waiting]))
    order = list(comfyui.prompt_posts)
    assert [order.index(p.prompt_id) for p in plans] == [0, 1, 2, 3, 4]


async def test_a_queued_job_cancelled_ends_at_once_and_never_reaches_comfyui(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 3.0
    async with spillway(A40_MAX_JOBS=1) as sw:
        holder = await sw.start(cloud=False)
        await sw.jobs.until(holder, "running_local")
        queued = await sw.start(cloud=False)
        await sw.jobs.until(queued, "queued")
        plan = await sw.jobs.cancel(queued)
        assert plan.state == "cancelled" and plan.prompt_id is None
        assert await sw.line_is(lambda line: line == []) == []
        assert (await holder.result()).state == "completed"
        assert len(comfyui.prompt_posts) == 1
        assert [p for h in (await sw.settled()).hosts for p in h.places] == []


async def test_a_holder_terminated_by_an_operator_frees_its_place_once_its_prompt_is_out(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 600.0
    interruptible_at_every_second(comfyui)
    async with spillway(A40_MAX_JOBS=1, SPILLWAY_POOL_HOLDER_CHECK_S=4) as sw:
        holder = await sw.start(cloud=False)
        await sw.jobs.until(holder, "running_local")
        comfyui.execution_s, comfyui.progress_steps = 0.5, 10
        nxt = await sw.start(cloud=False)
        await sw.jobs.until(nxt, "queued")
        await holder.terminate(reason="operator")
        started = asyncio.get_running_loop().time()
        # Found gone within 6 s (1.5 times the holder check); then its prompt is taken out
        # (stopped within a second here) and seen gone at the next check. The bound is loose:
        # what it rules out is the 2-minute ask or no check at all.
        await sw.jobs.until(nxt, "running_local", timeout_s=120)
        assert asyncio.get_running_loop().time() - started <= 60
        # Its prompt was taken out of ComfyUI before the place went on: never two at once.
        assert comfyui.most_held == 1
        assert (await nxt.result()).state == "completed"


async def test_a_comfyui_restart_costs_the_jobs_in_line_nothing(spillway, comfyui: ComfyUISim):
    comfyui.execution_s = 600.0  # the admitted renders are still on when ComfyUI restarts
    async with spillway(A40_MAX_JOBS=2) as sw:
        handles = [await sw.start(cloud=False) for _ in range(2)]
        for handle in handles:
            await sw.jobs.until(handle, "running_local")
        await until(
            lambda: len(comfyui.queue_running) + len(comfyui.queue_pending),
            lambda held: held == 2,
            what="both admitted prompts in ComfyUI",
        )
        handles += [await sw.start(cloud=False) for _ in range(2)]
        await sw.line_is(lambda line: len(line) == 2)
        comfyui.execution_s = 1.0
        await comfyui.restart()
        plans = await asyncio.gather(*(h.result() for h in handles))
    assert all(p.state == "completed" for p in plans)
    assert all("comfyui_lost_prompt" in " ".join(p.reasons) for p in plans[:2])
    # The line's jobs reached ComfyUI once each, after the restart.
    assert [p.local_attempts for p in plans[2:]] == [1, 1]
    assert all(posted(comfyui, p) == 1 for p in plans[2:])


async def test_two_hosts_places_on_both_are_used_before_the_cloud(
    spillway, comfyui: ComfyUISim, tmp_path: Path
):
    comfyui.execution_s = 3.0
    async with ComfyUISim() as gpu_b:
        gpu_b.execution_s = 3.0
        tiers = two_host_tiers(
            tmp_path,
            {"name": "gpu-a", "comfyui_url": comfyui.url, "max_jobs": 1},
            {"comfyui_url": gpu_b.url, "max_jobs": 1},
        )
        async with (
            spillway(tiers, **ARMED) as sw,
            sampling(comfyui, gpu_b) as s,
        ):
            handles = [await sw.start() for _ in range(4)]
            plans = await asyncio.gather(*(h.result() for h in handles))
    assert sorted(str(p.host) for p in plans if p.route == "local") == ["gpu-a", "gpu-b"]
    cloud = [p for p in plans if p.route == "cloud"]
    assert len(cloud) == 2 and s.most <= 2
    assert any("gpu_places_full_gpu-a_1of1" in r for r in cloud[0].reasons)


async def test_approved_while_in_line_it_goes_to_the_cloud_and_the_line_moves_up(
    spillway, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    comfyui.execution_s = 4.0
    async with spillway(A40_MAX_JOBS=1) as sw:
        holder = await sw.start(cloud=False)
        await sw.jobs.until(holder, "running_local")
        asking = await sw.start(cloud=True)
        await sw.jobs.until(asking, "awaiting_approval")
        behind = await sw.start(cloud=False)
        assert await sw.line_is(lambda line: len(line) == 2) == [asking.id, behind.id]
        before = await sw.jobs.until(behind.id, "queued")
        assert before.queue is not None and before.queue.position == 2
        client_answer = await job_ops.decide(
            sw.client, asking.id, _decision(approved=True, by="ops")
        )
        assert client_answer.startswith("approved")
        assert await sw.line_is(lambda line: line == [behind.id]) == [behind.id]
        after = await sw.jobs.status(behind.id)
        assert after.queue is not None and after.queue.position == 1
        plans = await asyncio.gather(*(h.result() for h in (holder, asking, behind)))
    assert [p.route for p in plans] == ["local", "cloud", "local"]
    assert sum(minimax.create_calls_by_prompt.values()) == 1


def _decision(approved: bool, by: str) -> Any:
    from spillway.client.new_jobs import make_decision

    return make_decision(approved, by, "", False)


async def test_the_pool_continues_as_new_under_traffic_and_loses_no_ask(
    spillway, comfyui: ComfyUISim
):
    # A pool started beforehand ends its run every 5 signals: 12 jobs through one place make it
    # continue as new again and again while asks and give-backs keep arriving.
    comfyui.execution_s = 0.2
    async with spillway(A40_MAX_JOBS=1) as sw:
        await sw.client.start_workflow(
            names.GPU_POOL,
            PoolInput(signals_per_run=5),
            id=names.pool_id(sw.queue),
            task_queue=names.pool_queue(sw.queue),
        )
        handles = await asyncio.gather(*(sw.start(cloud=False) for _ in range(12)))
        async with asyncio.timeout(90):  # an ask lost would wait ASK_AGAIN (2 min) for a resend
            plans = await asyncio.gather(*(h.result() for h in handles))
        view = await sw.settled()
        runs = 0
        async for _ in sw.client.list_workflows(f"WorkflowId = '{names.pool_id(sw.queue)}'"):
            runs += 1
    assert all(p.state == "completed" for p in plans)
    assert all(posted(comfyui, p) == 1 for p in plans)
    assert view.line == [] and all(not h.places for h in view.hosts)
    assert runs >= 4


async def test_a_holder_reset_to_before_its_admission_gives_its_place_to_the_line(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.5
    comfyui.pause()  # prompts stay pending in ComfyUI: the holder holds its place meanwhile
    async with spillway(A40_MAX_JOBS=1) as sw:
        holder = await sw.start(cloud=False)
        await sw.jobs.until(holder, "running_local")
        nxt = await sw.start(cloud=False)
        await sw.jobs.until(nxt, "queued")
        first_run = (await holder.describe()).run_id
        started = asyncio.get_running_loop().time()
        new_run = await reset_to_first_workflow_task(sw.client, holder.id)
        # The reset run asks anew: the earlier run's place goes to the line, the reset run
        # waits behind it.
        await sw.jobs.until(nxt, "running_local", timeout_s=95)
        assert asyncio.get_running_loop().time() - started <= 90
        comfyui.resume()
        plans = await asyncio.gather(
            nxt.result(),
            sw.client.get_workflow_handle(holder.id, run_id=new_run, result_type=Plan).result(),
        )
        view = await sw.settled()
    assert [p.state for p in plans] == ["completed", "completed"]
    before = await admitted_asks(sw.client.get_workflow_handle(holder.id, run_id=first_run))
    after = await admitted_asks(sw.client.get_workflow_handle(holder.id, run_id=new_run))
    assert len(before) == 1
    # The reset run was given a place once, for its own ask (the earlier run's admission,
    # reapplied by the reset, went straight back).
    assert len([a for a in after if a not in before]) == 1
    assert posted(comfyui, plans[1]) == 1
    assert view.line == [] and all(not h.places for h in view.hosts)
    # The earlier run's prompt left ComfyUI before its place went to the next job.
    assert comfyui.most_held == 1


async def test_a_job_reset_to_after_its_admission_posts_only_on_a_place_the_pool_gives_it(
    spillway, comfyui: ComfyUISim
):
    """Its download gave the place back and the pool handed it on; the reset run replays its
    admission but posts nothing on it: the pool shows the place as another job's, so the
    reset run asks again, waits in line and renders once the place is free."""
    comfyui.execution_s = 0.3
    async with spillway(A40_MAX_JOBS=1) as sw:
        done = await sw.start(cloud=False)
        first = await done.result()
        comfyui.pause()  # the next holder's prompt stays pending: it holds the place
        holder = await sw.start(cloud=False)
        await sw.jobs.until(holder, "running_local")

        again = await reset_to_after_its_admission(sw.client, done.id)
        await sw.jobs.until(done.id, "queued")
        assert comfyui.most_held == 1
        comfyui.resume()
        plans = await asyncio.gather(
            holder.result(),
            sw.client.get_workflow_handle(done.id, run_id=again, result_type=Plan).result(),
        )
    assert [p.state for p in plans] == ["completed", "completed"]
    assert "place_taken=a40_local" in plans[1].reasons
    assert posted(comfyui, first) == 1 and posted(comfyui, plans[1]) == 1
    assert comfyui.most_held == 1


async def test_a_job_reset_mid_render_takes_its_earlier_run_s_prompt_out_before_posting(
    spillway, comfyui: ComfyUISim
):
    """Reset to after its admission while its prompt renders: the reset run holds the same
    place, and the earlier run's prompt is on it; it is taken out before the new one is posted."""
    comfyui.execution_s = 600.0  # the earlier run's render would go on for ten minutes
    interruptible_at_every_second(comfyui)
    async with spillway(A40_MAX_JOBS=1) as sw:
        job = await sw.start(cloud=False)
        await sw.jobs.until(job, "running_local")
        earlier = (await job_ops.status(sw.client, job.id)).prompt_id or ""
        await until(lambda: [item[1] for item in comfyui.queue_running] == [earlier])
        comfyui.execution_s, comfyui.progress_steps = 0.5, 10
        again = await reset_to_after_its_admission(sw.client, job.id)
        plan = await sw.client.get_workflow_handle(job.id, run_id=again, result_type=Plan).result()
    assert plan.state == "completed" and plan.prompt_id != earlier
    assert f"earlier_run_prompt_taken_out={earlier}" in plan.reasons
    assert comfyui.state_of(earlier) == "done"  # interrupted: a 600 s render ends no other way
    assert posted(comfyui, plan) == 1 and comfyui.most_held == 1


async def test_a_continue_as_new_in_the_middle_of_the_line_keeps_its_order_and_places(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.2
    comfyui.pause()  # the holder's prompt stays pending: nothing frees while the line is read
    async with spillway(A40_MAX_JOBS=1) as sw:
        # Six signals to a run: five asks, then the sixth (a give-back of nobody's) ends it.
        pool = await sw.client.start_workflow(
            names.GPU_POOL,
            PoolInput(signals_per_run=6),
            id=names.pool_id(sw.queue),
            task_queue=names.pool_queue(sw.queue),
        )
        holder = await sw.start(cloud=False)
        await sw.jobs.until(holder, "running_local")
        waiting = []
        for n, priority in enumerate((3, 3, 1, 3), start=1):
            # One after another: the line is in the order the jobs asked, not were started.
            waiting.append(await sw.start(cloud=False, priority=priority))
            await sw.line_is(lambda line, n=n: len(line) == n)
        before = await sw.view()
        assert [i.job_id for i in before.line] == [waiting[i].id for i in (2, 0, 1, 3)]
        await pool.signal(names.POOL_LEAVE, PoolLeave(job_id="nobody", asked_at=datetime.now(UTC)))
        latest = sw.client.get_workflow_handle(pool.id)
        await until(latest.describe, lambda d: d.run_id != pool.run_id, what="the pool's next run")
        after = await sw.view()
        assert after.line == before.line and after.hosts == before.hosts
        comfyui.resume()
        plans = await asyncio.gather(*(h.result() for h in (holder, *waiting)))
    assert all(p.state == "completed" for p in plans)
    assert all(posted(comfyui, p) == 1 for p in plans)


async def test_with_no_host_answering_a_local_job_waits_queued_until_one_does(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.2
    await comfyui.stop()
    async with spillway(UNREACHABLE_CONFIRM_S=0.5) as sw:
        job = await sw.start(cloud=False)
        plan = await sw.jobs.until(job, "queued", timeout_s=30)
        assert plan.overflow.trigger == "unreachable" and plan.queue is not None
        assert (await sw.view()).hosts[0].reachable is False
        await comfyui.start()  # the pool's next probe finds it: the job takes a place
        plan = await job.result()
    assert (plan.state, plan.route) == ("completed", "local")
    assert posted(comfyui, plan) == 1


async def test_with_no_host_answering_a_local_job_gives_up_after_unreachable_give_up_s(
    spillway, comfyui: ComfyUISim
):
    await comfyui.stop()
    async with spillway(UNREACHABLE_CONFIRM_S=0.5, UNREACHABLE_GIVE_UP_S=5) as sw:
        job = await sw.start(cloud=False)
        plan = await sw.jobs.until(job, "failed", timeout_s=60)
        # The job fails first; the pool takes it out of the line when its give-back arrives.
        await sw.line_is(lambda line: line == [])
    assert plan.error is not None and "ComfyUI did not answer for 0:00:05" in plan.error
    assert "asks for no cloud" in plan.error


async def test_a_pool_started_after_one_was_terminated_counts_the_places_still_held(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.2
    comfyui.pause()  # the holder's prompt stays pending in ComfyUI: its place stays held
    async with spillway(A40_MAX_JOBS=1) as sw:
        holder = await sw.start(cloud=False)
        await sw.jobs.until(holder, "running_local")
        await sw.client.get_workflow_handle(names.pool_id(sw.queue)).terminate("operator")
        # The next ask starts a new pool: it finds the holder's place before it admits anyone.
        nxt = await sw.start(cloud=False)
        plan = await sw.jobs.until(nxt, "queued")
        assert plan.queue is not None and plan.queue.position == 1
        view = await sw.view()
        assert [p.job_id for h in view.hosts for p in h.places] == [holder.id]
        comfyui.resume()
        plans = await asyncio.gather(holder.result(), nxt.result())
    assert [p.state for p in plans] == ["completed", "completed"]
    assert comfyui.most_held == 1


async def test_the_queue_as_json_with_two_places_held_and_three_in_line_then_one_render_ended(
    spillway, comfyui: ComfyUISim, cli_env, dev_env
):
    comfyui.execution_s = 0.2
    comfyui.pause()  # the holders' prompts stay pending: the places stay held while it is read
    async with spillway(A40_MAX_JOBS=2) as sw:
        holders = [await sw.start(cloud=False) for _ in range(2)]
        for holder in holders:
            await sw.jobs.until(holder, "running_local")
        waiting = []
        for n, priority in enumerate((3, 3, 1), start=1):
            waiting.append(await sw.start(cloud=False, priority=priority))
            await sw.line_is(lambda line, n=n: len(line) == n)
        env = cli_env(
            TEMPORAL_ADDRESS=dev_env.client.service_client.config.target_host,
            SPILLWAY_TASK_QUEUE=sw.queue,
        )
        code, out, err = await cli("queue", "--json", env=env)
        assert code == 0, err
        shown = json.loads(out)
        [host] = shown["hosts"]
        assert (host["name"], host["max_jobs"], host["reachable"]) == ("a40_local", 2, True)
        assert sorted(p["job_id"] for p in host["places"]) == sorted(h.id for h in holders)
        assert {p["state"] for p in host["places"]} == {"running_local"}
        line = [(i["position"], i["job_id"], i["priority"], i["state"]) for i in shown["line"]]
        assert line == [
            (1, waiting[2].id, 1, "queued"),
            (2, waiting[0].id, 3, "queued"),
            (3, waiting[1].id, 3, "queued"),
        ]
        assert {i["why"] for i in shown["line"]} == {"places taken (a40_local 2/2)"}
        # One render ends: its place goes to the head of the line, the rest move up.
        comfyui.execution_s = 2.0
        comfyui.resume()
        await until(lambda: comfyui.queue_running, bool, every_s=0.01, what="one render")
        comfyui.pause()  # that render finishes; nothing starts after it
        await sw.line_is(lambda line: len(line) == 2)
        code, out, err = await cli("queue", "--json", env=env)
        positions = [(i["position"], i["job_id"]) for i in json.loads(out)["line"]]
        comfyui.resume()
        plans = await asyncio.gather(*(h.result() for h in [*holders, *waiting]))
    assert positions == [(1, waiting[0].id), (2, waiting[1].id)]
    assert all(p.state == "completed" for p in plans) and comfyui.most_held == 2


async def test_a_local_job_gives_its_place_back_with_its_download_and_sends_no_signal_of_its_own(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.2
    async with spillway(A40_MAX_JOBS=1) as sw:
        first = await sw.start(cloud=False)
        nxt = await sw.start(cloud=False)
        plans = await asyncio.gather(first.result(), nxt.result())
        view = await sw.settled()
        histories = [await h.fetch_history() for h in (first, nxt)]
    assert [p.state for p in plans] == ["completed", "completed"]
    assert [p.job_id for h in view.hosts for p in h.places] == []
    for history in histories:
        signalled = [
            e.signal_external_workflow_execution_initiated_event_attributes.signal_name
            for e in history.events
            if e.HasField("signal_external_workflow_execution_initiated_event_attributes")
        ]
        assert names.POOL_LEAVE not in signalled
        [downloaded] = [
            json.loads(e.activity_task_completed_event_attributes.result.payloads[0].data)
            for e in history.events
            if e.HasField("activity_task_completed_event_attributes")
            and b'"released"' in e.activity_task_completed_event_attributes.result.payloads[0].data
        ]
        assert downloaded["released"] is True
    assert comfyui.most_held == 1


async def test_a_terminated_pool_s_line_asks_a_new_pool_by_itself_and_runs(
    spillway, comfyui: ComfyUISim, cli_env, dev_env
):
    comfyui.execution_s = 0.2
    comfyui.pause()  # the holder's prompt stays pending: its place stays held
    async with spillway(A40_MAX_JOBS=1, SPILLWAY_POOL_LINE_CHECK_S=3) as sw:
        holder = await sw.start(cloud=False)
        await sw.jobs.until(holder, "running_local")
        waiting = await sw.start(cloud=False)
        await sw.line_is(lambda line: line == [waiting.id])
        # Its position reached it: it waits in line (checking every 3 s), no longer for the
        # answer to its ask (asked again after 2 minutes).
        await sw.jobs.until(waiting, lambda plan: plan.queue is not None)
        ended = await terminate_pool(sw)
        # Neither the queue nor the job's status shows the closed pool's places or line as live.
        closed = await sw.view()
        assert (closed.pool, closed.closed, closed.hosts, closed.line) == (
            "closed",
            "TERMINATED",
            [],
            [],
        )
        env = cli_env(
            TEMPORAL_ADDRESS=dev_env.client.service_client.config.target_host,
            SPILLWAY_TASK_QUEUE=sw.queue,
        )
        code, out, err = await cli("queue", env=env)
        assert code == 0 and "the GPU pool is closed (TERMINATED)" in out, err
        assert (await job_ops.status(sw.client, waiting.id)).queue is None
        comfyui.resume()
        assert (await holder.result()).state == "completed"
        # Nobody else asks: the job in line starts a new pool by its own check, and runs.
        plan = await waiting.result()
        pool = await sw.client.get_workflow_handle(names.pool_id(sw.queue)).describe()
    assert (plan.state, plan.route) == ("completed", "local")
    assert pool.run_id != ended
    assert posted(comfyui, plan) == 1 and comfyui.most_held == 1


async def test_a_new_pool_takes_back_the_terminated_one_s_line_in_its_order(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.2
    comfyui.pause()
    async with spillway(A40_MAX_JOBS=1) as sw:  # no line check within the test's time
        holder = await sw.start(cloud=False)
        await sw.jobs.until(holder, "running_local")
        first = await sw.start(cloud=False, priority=4)
        await sw.line_is(lambda line: line == [first.id])
        await terminate_pool(sw)
        # A later job starts the new pool: the holder's place and the line come back, and the
        # earlier job stays ahead of it by its first ask.
        later = await sw.start(cloud=False, priority=4)
        await sw.line_is(lambda line: line == [first.id, later.id])
        view = await sw.view()
        assert [p.job_id for h in view.hosts for p in h.places] == [holder.id]
        comfyui.resume()
        plans = await asyncio.gather(*(h.result() for h in (holder, first, later)))
    assert [p.state for p in plans] == ["completed"] * 3
    assert all(posted(comfyui, p) == 1 for p in plans) and comfyui.most_held == 1


async def test_an_ask_forged_in_a_holder_s_name_frees_nothing_and_nobody_is_admitted_beside_it(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.2
    comfyui.pause()  # the holder's prompt stays pending: its place stays held
    async with spillway(A40_MAX_JOBS=1) as sw:
        holder, nxt = await sw.holder_and_next()
        pool_id = names.pool_id(sw.queue)
        before = await checks_done(sw.client, pool_id)
        # Anyone with signal rights, naming the holder with an ask time of their own (as a reset
        # run of the holder would ask).
        forged = PoolAsk(job_id=holder.id, asked_at=datetime.now(UTC))
        await sw.client.get_workflow_handle(pool_id).signal(names.POOL_ASK, forged)

        # The pool asks the holder at once whether it still holds its place (it does), where
        # taking the ask on its word would free the place and admit the next job beside it.
        async def settled() -> bool:
            return await checks_done(sw.client, pool_id) > before or nxt.id not in await sw.line()

        await until(settled, what="a holder check, or the next job admitted")
        view = await sw.view()
        assert [p.job_id for h in view.hosts for p in h.places] == [holder.id]
        assert [i.job_id for i in view.line] == [nxt.id]
        comfyui.resume()
        plans = await asyncio.gather(holder.result(), nxt.result())
    assert [p.state for p in plans] == ["completed", "completed"]
    assert comfyui.most_held == 1
    assert len(await admitted_asks(holder)) == 1  # the forged ask was never answered


async def test_a_give_back_forged_in_a_holder_s_name_frees_nothing_and_takes_no_prompt_out(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.2
    comfyui.pause()  # the holder's prompt stays pending: its place stays held
    async with spillway(A40_MAX_JOBS=1) as sw:
        holder, nxt = await sw.holder_and_next()
        pool_id = names.pool_id(sw.queue)
        before = await checks_done(sw.client, pool_id)
        # Anyone who can read the holder's history and signal the pool: its ask time and its
        # prompt, as the job's own give-back would name them after losing its host.
        [asked_at] = await admitted_asks(holder)
        prompt_id = (await job_ops.status(sw.client, holder.id)).prompt_id
        assert prompt_id in [item[1] for item in comfyui.queue_pending]
        forged = PoolLeave.model_validate(
            {"job_id": holder.id, "asked_at": asked_at, "prompt_id": prompt_id}
        )
        await sw.client.get_workflow_handle(pool_id).signal(names.POOL_LEAVE, forged)

        # The pool asks the holder (it still holds its place) until the give-back is dropped,
        # where taking it on its word would take the prompt out and admit the next job.
        async def settled() -> bool:
            done = await checks_done(sw.client, pool_id) >= before + LEAVE_CHECKS
            return done or nxt.id not in await sw.line()

        await until(settled, what="the holder checks, or the next job admitted")
        view = await sw.view()
        assert [(p.job_id, p.clearing) for h in view.hosts for p in h.places] == [(holder.id, None)]
        assert [i.job_id for i in view.line] == [nxt.id]
        assert prompt_id in [item[1] for item in comfyui.queue_pending]
        comfyui.resume()
        plans = await asyncio.gather(holder.result(), nxt.result())
    assert [p.state for p in plans] == ["completed", "completed"]
    assert all(posted(comfyui, p) == 1 for p in plans) and comfyui.most_held == 1


async def test_a_host_partitioned_mid_render_keeps_the_place_until_its_prompt_is_out(
    spillway, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    comfyui.execution_s = 600.0  # the partitioned render would go on for ten minutes
    interruptible_at_every_second(comfyui)
    async with spillway(
        A40_MAX_JOBS=1,
        HOST_LOST_AFTER_S=3,
        SPILLWAY_POOL_HOLDER_CHECK_S=4,
        COMFYUI_REQUEST_TIMEOUT_S=3,  # what each call to the silent host costs (30 s by default)
        **ARMED,
    ) as sw:
        lost = await sw.start()
        await sw.jobs.until(lost, "running_local")
        comfyui.faults["*"] = "hang"  # silent, as after a power cut
        plan = await lost.result()
        assert (plan.route, plan.state) == ("cloud", "completed")
        # The host still renders the prompt nobody waits for: its place stays held.
        view = await sw.view()
        [place] = [p for h in view.hosts for p in h.places]
        assert (place.job_id, place.clearing) == (lost.id, plan.prompt_id)
        comfyui.execution_s, comfyui.progress_steps = 0.5, 10
        nxt = await sw.start(cloud=False)
        await sw.line_is(lambda line: line == [nxt.id])
        comfyui.faults.clear()  # the host answers again: the prompt is taken out, then the place
        assert (await nxt.result()).state == "completed"
    assert comfyui.most_held == 1
    assert sum(minimax.create_calls_by_prompt.values()) == 1


async def test_workers_restarted_with_more_places_reach_the_pool_with_the_next_ask(
    spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.2
    comfyui.pause()  # the admitted prompts stay pending: their places stay held
    queue = f"adm-{uuid.uuid4()}"
    async with spillway(A40_MAX_JOBS=1, SPILLWAY_TASK_QUEUE=queue) as sw:
        holder = await sw.start(cloud=False)
        await sw.jobs.until(holder, "running_local")
        waiting = await sw.start(cloud=False)
        await sw.line_is(lambda line: line == [waiting.id])
    # A deploy with two places: the next job's ask shows the pool other places than its own,
    # and the pool reads the workers' policy then, not at its next 5-minute read.
    async with spillway(A40_MAX_JOBS=2, SPILLWAY_TASK_QUEUE=queue) as sw:
        later = await sw.start(cloud=False)
        await sw.jobs.until(waiting, "running_local", timeout_s=60)
        assert [h.max_jobs for h in (await sw.view()).hosts] == [2]
        comfyui.resume()
        plans = await asyncio.gather(*(h.result() for h in (holder, waiting, later)))
    assert [p.state for p in plans] == ["completed"] * 3
    assert comfyui.most_held == 2


async def test_a_host_added_by_a_deploy_takes_the_job_in_line_which_renders_there(
    spillway, comfyui: ComfyUISim, tmp_path: Path
):
    """Workers restarted with a second host tell the pool their places at once; the job in line,
    whose own policy has only the first host, renders on the host the pool admitted it to."""
    comfyui.execution_s = 0.2
    comfyui.pause()  # the holder's prompt stays pending: its place stays held
    queue = f"adm-{uuid.uuid4()}"
    async with spillway(A40_MAX_JOBS=1, SPILLWAY_TASK_QUEUE=queue) as sw:
        holder = await sw.start(cloud=False)
        await sw.jobs.until(holder, "running_local")
        waiting = await sw.start(cloud=False)
        await sw.line_is(lambda line: line == [waiting.id])
    async with ComfyUISim() as gpu_b:
        gpu_b.execution_s = 0.2
        tiers = two_host_tiers(
            tmp_path,
            {"comfyui_url": comfyui.url, "max_jobs": 1},
            {"comfyui_url": gpu_b.url, "max_jobs": 1},
        )
        async with spillway(tiers, SPILLWAY_TASK_QUEUE=queue) as sw:
            # Nobody else asks: the restart alone reaches the pool (its policy read: 5 minutes).
            async with asyncio.timeout(60):
                plan = await waiting.result()
            assert (plan.state, plan.host) == ("completed", "gpu-b")
            assert posted(gpu_b, plan) == 1 and posted(comfyui, plan) == 0
            comfyui.resume()
            assert (await holder.result()).state == "completed"
    assert comfyui.most_held == 1 and gpu_b.most_held == 1


async def test_a_job_whose_ask_the_pool_never_answers_asks_again_and_runs(
    spillway, comfyui: ComfyUISim, dev_env: WorkflowEnvironment
):
    """A pool started under spillway's id on a task queue no spillway worker polls takes the
    job's ask and never answers: after SPILLWAY_POOL_ASK_AGAIN_S the job asks again by the
    activity, which ends that pool and starts spillway's own with the ask."""
    comfyui.execution_s = 0.2
    queue = f"adm-{uuid.uuid4()}"
    foreign = await dev_env.client.start_workflow(
        names.GPU_POOL, PoolInput(), id=names.pool_id(queue), task_queue=f"nobody-{uuid.uuid4()}"
    )
    async with spillway(SPILLWAY_TASK_QUEUE=queue, SPILLWAY_POOL_ASK_AGAIN_S=3) as sw:
        job = await sw.start(cloud=False)
        plan = await job.result()
        ended = await sw.client.get_workflow_handle(
            foreign.id, run_id=foreign.result_run_id
        ).describe()
    assert (plan.state, plan.route) == ("completed", "local")
    assert ended.status == WorkflowExecutionStatus.TERMINATED
    assert posted(comfyui, plan) == 1
