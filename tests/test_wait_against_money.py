"""`spillway quote` end to end: the worker and its agent on the real dev server, the ComfyUI
double, the MiniMax double for the cloud's figures. Each route a quote can give, the line's
position and ETA from the renders seen, and nothing started by asking."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from spillway.cli.render import render_plan
from spillway.client import SpillwayClient
from spillway.client import jobs as job_ops
from spillway.client.queue import pool_view
from spillway.core import names
from spillway.core.gpu_pool import PoolAnswer, PoolAsk, PoolInput, PoolLeave
from spillway.core.models import CloudRequest, JobPlace, Plan, Quote, VideoJob
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.support.cli import spillway as cli
from tests.support.constants import CLIP_USD
from tests.support.graphs import GRAIN_GRAPH, VIDEO_GRAPH
from tests.support.jobs import Jobs
from tests.support.one_host import one_host
from tests.support.waiting import until
from workflows.texts import current_details

pytestmark = pytest.mark.full

CLOUD = CloudRequest(prompt="a lighthouse at dusk")
T_FORGED = datetime(2026, 1, 1, tzinfo=UTC)  # an ask time no job of these tests asked at


class Studio:
    def __init__(self, client: SpillwayClient, jobs: Jobs) -> None:
        self.client, self.jobs = client, jobs

    async def quote(self, cloud: bool = False, graph: dict[str, Any] = VIDEO_GRAPH) -> Quote:
        job = VideoJob(
            job_id=f"quote-{uuid.uuid4().hex[:8]}", graph=graph, cloud=CLOUD if cloud else None
        )
        return await self.client.quote(job)

    async def start(self) -> Any:
        job = VideoJob(job_id=f"held-{uuid.uuid4().hex[:8]}", graph=VIDEO_GRAPH)
        return await job_ops.submit(self.jobs.client, job, self.jobs.task_queue)


@pytest.fixture
def studio(
    dev_env: WorkflowEnvironment,
    comfyui: ComfyUISim,
    minimax: MiniMaxSim,
    gpu: Any,
    tmp_path: Path,
) -> Callable[..., Any]:
    comfyui.execution_s = 0.3

    @asynccontextmanager
    async def run(**overrides: Any) -> AsyncIterator[Studio]:
        studio_settings = {"A40_MAX_JOBS": 2, "CLOUD_DAILY_BUDGET_USD": 5} | overrides
        async with one_host(
            dev_env.client, comfyui, minimax, gpu, tmp_path, **studio_settings
        ) as settings:
            client = SpillwayClient(dev_env.client, settings=settings)
            yield Studio(client, Jobs(dev_env.client, settings.SPILLWAY_TASK_QUEUE))

    return run


async def test_each_route_a_quote_gives_with_the_line_s_position_and_eta_and_nothing_started(
    studio, comfyui: ComfyUISim, cli_env, dev_env
):
    async with studio() as st:
        # An idle host: a place now.
        idle = await st.quote()
        assert (idle.route, idle.local.position, idle.local.hosts) == ("local", 0, ["a40_local"])
        assert idle.cloud is None and idle.why.startswith("a place on a40_local now")
        # Two renders seen, then both places held (their prompts pending) and one in line.
        for _ in range(2):
            assert (await (await st.start()).result()).state == "completed"
        comfyui.pause()
        held = [await st.start() for _ in range(2)]
        for job in held:
            await st.jobs.until(job, "running_local")
        waiting = await st.start()
        await st.jobs.until(waiting, "queued")
        line = await st.quote()
        assert (line.route, line.local.position) == ("local", 2)
        assert line.local.eta_s is not None and line.local.eta_s > 0
        assert line.why.startswith("2nd in line for the GPUs, about ")
        # With a cloud prompt and the fallback not armed: a person would be asked.
        ask = await st.quote(cloud=True)
        assert ask.route == "await_approval" and ask.local.position == 2
        assert ask.cloud is not None and ask.cloud.provider == "minimax"
        assert (ask.cloud.estimate_usd, ask.cloud.budget_left_usd) == (CLIP_USD, 5.0)
        # The command: the same as JSON; nothing was started by any of it.
        env = cli_env(
            TEMPORAL_ADDRESS=dev_env.client.service_client.config.target_host,
            SPILLWAY_TASK_QUEUE=st.jobs.task_queue,
        )
        code, out, err = await cli(
            "quote", "--graph", "examples/video_graph.json", "--json", env=env
        )
        assert code == 0, err
        assert Quote.model_validate(json.loads(out)).local.position == 2
        view = await pool_view(st.jobs.client, st.jobs.task_queue)
        assert [i.job_id for i in view.line] == [waiting.id]
        assert len(comfyui.prompt_posts) == 4
        comfyui.resume()
        await waiting.result()
    # A graph no host can run: the message a job would fail with (exit 1 from the command).
    async with studio() as st:
        with pytest.raises(Exception, match="no GPU host can run this graph"):
            await st.quote(graph=GRAIN_GRAPH)


async def test_armed_with_every_place_taken_the_quote_is_the_cloud(studio, comfyui: ComfyUISim):
    async with studio(CLOUD_VIDEO_FALLBACK_ENABLED=True) as st:
        comfyui.pause()
        held = [await st.start() for _ in range(2)]
        for job in held:
            await st.jobs.until(job, "running_local")
        quote = await st.quote(cloud=True)
        comfyui.resume()
        await until(lambda: all(comfyui.state_of(p) == "done" for p in comfyui.prompt_posts))
    assert quote.route == "cloud" and quote.why.startswith("the GPU hosts are overloaded")
    assert quote.cloud is not None and quote.cloud.estimate_usd == CLIP_USD


async def renders_seen(st: Studio, comfyui: ComfyUISim, seconds: float) -> float:
    """Two renders of `seconds` each, so that the line has an estimate; returns how long they
    took, which neither render outlasted."""
    comfyui.execution_s = seconds
    began = time.monotonic()
    done = await asyncio.gather(*[(await st.start()).result() for _ in range(2)])
    assert all(plan.state == "completed" for plan in done)
    return time.monotonic() - began


async def both_places_held(st: Studio, comfyui: ComfyUISim, outlast_s: float = 0.0) -> list[Any]:
    """Both places held, their prompts pending; until both have rendered `outlast_s`, longer
    than any render seen, so that the line's estimate is a typical render from now on."""
    comfyui.pause()
    held = [await st.start() for _ in range(2)]
    for job in held:
        await st.jobs.until(job, "running_local")

    async def shortest_hold() -> float:
        view = await pool_view(st.jobs.client, st.jobs.task_queue)
        now = datetime.now(UTC)
        return min((now - p.since).total_seconds() for h in view.hosts for p in h.places)

    await until(shortest_hold, lambda s: s > outlast_s, what="the renders outlasting those seen")
    return held


async def armed_job(st: Studio, **patience: Any) -> Any:
    job = VideoJob(
        job_id=f"patient-{uuid.uuid4().hex[:8]}", graph=VIDEO_GRAPH, cloud=CLOUD, **patience
    )
    return await job_ops.submit(st.jobs.client, job, st.jobs.task_queue)


def creates(minimax: MiniMaxSim) -> int:
    return sum(minimax.create_calls_by_prompt.values())


async def test_armed_and_full_a_patient_job_waits_in_line_and_renders_here_spending_nothing(
    studio, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    async with studio(CLOUD_VIDEO_FALLBACK_ENABLED=True) as st:
        took = await renders_seen(st, comfyui, 2.0)
        await both_places_held(st, comfyui, outlast_s=took)
        patient = await armed_job(st, max_wait_s=600)
        plan = await st.jobs.until(
            patient, lambda p: p.state == "queued" and p.patience_until is not None
        )
        assert "line_eta_2s_within_max_wait_600s" in plan.reasons
        # Its decision's quote, as `spillway quote` would have given it then (status --json).
        assert plan.quote is not None and plan.quote.route == "local"
        assert (plan.quote.local.position, plan.quote.local.eta_s) == (1, 2.0)
        assert plan.quote.cloud is not None and plan.quote.cloud.estimate_usd == CLIP_USD
        assert plan.quote.why.startswith("1st in line for the GPUs, about 2 s;")
        # The UI's details weigh both: its start here, and the cloud's price now.
        assert plan.budget is not None and plan.budget.estimate_usd == CLIP_USD
        said = "Starts in about 2 s here (estimated when it joined the line), or $0.28 on MiniMax"
        assert said in current_details(plan)
        # `spillway queue` shows when it would go to the cloud, as its plan does.
        line = (await pool_view(st.jobs.client, st.jobs.task_queue)).line
        assert [(i.job_id, i.patience_until) for i in line] == [(patient.id, plan.patience_until)]
        comfyui.resume()
        plan = await patient.result()
    assert (plan.state, plan.route) == ("completed", "local")
    assert creates(minimax) == 0


async def test_armed_and_full_a_job_whose_patience_is_shorter_than_the_line_goes_to_the_cloud(
    studio, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    async with studio(CLOUD_VIDEO_FALLBACK_ENABLED=True) as st:
        took = await renders_seen(st, comfyui, 2.0)
        held = await both_places_held(st, comfyui, outlast_s=took)
        hasty = await (await armed_job(st, max_wait_s=1)).result()
        # The renders ahead run on: a job in line whose estimated start passes its patience
        # leaves for the cloud then, before its patience is out, and the job behind moves up.
        patient = await armed_job(st, max_wait_s=5)
        await st.jobs.until(patient, "queued")
        behind = await st.start()
        await st.jobs.until(behind, "queued")
        waited = await patient.result()
        line = await pool_view(st.jobs.client, st.jobs.task_queue)
        # Two videos made in the cloud: the cloud's ETA learnt their create-to-done times.
        learnt = await st.quote(cloud=True)
        comfyui.resume()
        await asyncio.gather(behind.result(), *(h.result() for h in held))
    assert (hasty.route, hasty.state) == ("cloud", "completed")
    assert "line_eta_2s_gt_max_wait_1s" in hasty.reasons
    assert hasty.quote is not None and hasty.quote.route == "cloud"
    assert (hasty.quote.local.position, hasty.quote.local.eta_s) == (1, 2.0)
    assert (waited.route, waited.state) == ("cloud", "completed")
    assert any(r.startswith("line_eta_2s_gt_patience_left_") for r in waited.reasons), waited
    assert [i.job_id for i in line.line] == [behind.id]
    assert creates(minimax) == 2
    assert learnt.cloud is not None and learnt.cloud.eta_s is not None and learnt.cloud.eta_s > 0


async def test_with_no_estimate_yet_a_patient_job_waits_until_its_patience_is_out(
    studio, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    async with studio(CLOUD_VIDEO_FALLBACK_ENABLED=True) as st:
        held = await both_places_held(st, comfyui)
        # Without a patience, today's rule: the cloud as soon as the places are full.
        hasty = await (await armed_job(st)).result()
        # With one, and no render seen: an estimate nobody has never spends; its patience does.
        began = time.monotonic()
        short = await (await armed_job(st, max_wait_s=3)).result()
        waited = time.monotonic() - began
        comfyui.resume()
        await asyncio.gather(*(h.result() for h in held))
    assert hasty.route == "cloud" and "gpu_places_full_a40_local_2of2" in hasty.reasons
    assert short.route == "cloud" and "line_eta_unknown_waits_max_wait_3s" in short.reasons
    assert any(r.startswith("waited_") for r in short.reasons), short.reasons
    assert waited >= 3
    assert creates(minimax) == 2


async def test_a_pool_started_after_a_terminate_sends_no_patient_job_to_the_cloud_at_once(
    studio, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    async with studio(CLOUD_VIDEO_FALLBACK_ENABLED=True, CLOUD_OVERFLOW_AFTER_S=600) as st:
        await renders_seen(st, comfyui, 1.0)
        held = await both_places_held(st, comfyui)
        # The operator's remedy for a wedged pool: the next ask starts one that has seen no
        # render (it took 1 create: `line_eta_unknown_max_wait_600s`).
        await st.jobs.client.get_workflow_handle(names.pool_id(st.jobs.task_queue)).terminate()
        patient = await armed_job(st)
        plan = await st.jobs.until(patient, lambda p: p.state != "probing")
        assert plan.state == "queued" and plan.patience_until is not None, plan
        assert "line_eta_unknown_waits_max_wait_600s" in plan.reasons
        comfyui.resume()
        plans = await asyncio.gather(patient.result(), *(h.result() for h in held))
    assert [(p.state, p.route) for p in plans] == [("completed", "local")] * 3
    assert creates(minimax) == 0


async def test_render_times_in_a_pool_s_start_input_are_nobody_s_word(
    studio, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    async with studio(CLOUD_VIDEO_FALLBACK_ENABLED=True, CLOUD_OVERFLOW_AFTER_S=600) as st:
        held = await both_places_held(st, comfyui)
        queue = st.jobs.task_queue
        pool = st.jobs.client.get_workflow_handle(names.pool_id(queue))
        await pool.terminate()
        # Anyone who can start workflows starts the next pool, with hour-long renders "seen".
        hour = PoolInput(holds_s={"a40_local": [3600.0] * 3})
        await st.jobs.client.start_workflow(
            names.GPU_POOL, hour, id=pool.id, task_queue=names.pool_queue(queue)
        )
        patient = await armed_job(st)
        plan = await st.jobs.until(patient, lambda p: p.state != "probing")
        assert plan.state == "queued" and "line_eta_unknown_waits_max_wait_600s" in plan.reasons
        comfyui.resume()
        plans = await asyncio.gather(patient.result(), *(h.result() for h in held))
    assert [(p.state, p.route) for p in plans] == [("completed", "local")] * 3
    assert creates(minimax) == 0


async def test_with_the_day_s_budget_spent_the_quote_and_the_job_both_wait_for_a_person(
    studio, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    """Issue 59: the quote said `cloud` while the job it quoted waited for approval with
    budget_exhausted, its own status saying "decided cloud: ... armed"."""
    async with studio(CLOUD_VIDEO_FALLBACK_ENABLED=True, CLOUD_DAILY_BUDGET_USD=CLIP_USD) as st:
        held = await both_places_held(st, comfyui)
        spender = await (await armed_job(st)).result()  # the day's budget: one clip
        quote = await st.quote(cloud=True)
        waiting = await armed_job(st)
        live = await st.jobs.until(
            waiting,
            lambda p: p.state == "awaiting_approval" and "budget_exhausted" in p.reasons,
        )
        status = await st.jobs.status(waiting.id)  # as `spillway status` reads it
        await st.jobs.cancel(waiting)
        comfyui.resume()
        await asyncio.gather(*(h.result() for h in held))
    assert (spender.route, spender.state) == ("cloud", "completed")
    said = (
        "budget_exhausted (day): the daily cloud budget ($0.28) has $0.00 left; this job's "
        "estimate is $0.28"
    )
    assert quote.route == "await_approval" and quote.why.startswith(said), quote.why
    assert "--over-budget" in quote.why and "fallback is armed" not in quote.why
    assert quote.cloud is not None and quote.cloud.budget_left_usd == 0.0
    for plan in (live, status):
        assert plan.quote is not None and plan.quote.route == "await_approval"
        assert plan.quote.why.startswith(said), plan.quote.why
        assert plan.budget is not None and plan.budget.exhausted == "day"
    assert f"decided   await_approval: {said}" in render_plan(status)
    assert creates(minimax) == 1


async def test_a_forged_late_answer_or_ask_never_sends_a_patient_job_to_the_cloud(
    studio, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    async with studio(CLOUD_VIDEO_FALLBACK_ENABLED=True) as st:
        took = await renders_seen(st, comfyui, 2.0)
        held = await both_places_held(st, comfyui, outlast_s=took)
        patient = await armed_job(st, max_wait_s=600)
        await st.jobs.until(patient, lambda p: p.state == "queued" and p.patience_until is not None)
        # Anyone with signal rights: the job's ask time read off its own query, then a `late`
        # answer to it, one to an ask it never sent, and asks in its name with a patience over
        # (ignored by the pool) and, after taking it out of the line, a short one (the pool
        # tells the job `late` by it).
        place = await patient.query(names.JOB_PLACE, result_type=JobPlace)
        asked_at = place.asked_at
        late = PoolAnswer(asked_at=asked_at, position=1, eta_s=9999.0, late=True)
        await patient.signal(names.POOL_ANSWER, late)
        await patient.signal(names.POOL_ANSWER, late.model_copy(update={"asked_at": T_FORGED}))
        pool = st.jobs.client.get_workflow_handle(names.pool_id(st.jobs.task_queue))
        now = datetime.now(UTC)
        forged = PoolAsk(job_id=patient.id, asked_at=asked_at, start_by=now - timedelta(seconds=1))
        await pool.signal(names.POOL_ASK, forged)
        await pool.signal(names.POOL_LEAVE, PoolLeave(job_id=patient.id, asked_at=asked_at))
        short = forged.model_copy(update={"start_by": now + timedelta(seconds=3)})
        await pool.signal(names.POOL_ASK, short)

        def forged_seen(p: Plan) -> int:
            return sum(i.why.startswith("ignored_forged_late: ") for i in p.ignored_signals)

        plan = await st.jobs.until(patient, lambda p: p.state != "queued" or forged_seen(p) >= 3)
        assert (plan.state, plan.route, forged_seen(plan)) == ("queued", None, 3), plan
        comfyui.resume()
        plans = await asyncio.gather(patient.result(), *(h.result() for h in held))
    assert [(p.state, p.route) for p in plans] == [("completed", "local")] * 3
    assert not any("patience_left" in r or "reached_patience" in r for r in plans[0].reasons)
    assert creates(minimax) == 0
