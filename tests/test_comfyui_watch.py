"""Many waits, one ComfyUI: the agent's watcher (activities/comfyui/watch.py) keeps one WebSocket
and one poll loop for every `comfyui_wait`, counted at the ComfyUI double (docs/design.md, "GPU
hosts and agents")."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.comfyui.activities import ComfyUIActivities
from activities.comfyui.models import ComfyUIFinished, ComfyUISubmit
from activities.comfyui.watch import HISTORY_READS
from spillway.core.models import Progress
from spillway.sim.comfyui_run import Failure
from tests.support.comfyui import ComfyUIDouble, submit_request, wait_request
from tests.support.graphs import SLOW_GRAPH, VIDEO_GRAPH
from tests.support.waiting import until

POLL_S = 0.2


class Waiting:
    """Waits running as activities, their heartbeats readable while they run."""

    def __init__(self, acts: ComfyUIActivities) -> None:
        self._acts = acts
        self.heartbeats: dict[str, list[Any]] = {}
        self.tasks: dict[str, asyncio.Task[Any]] = {}

    def start(self, submit: ComfyUISubmit) -> None:
        beats = self.heartbeats[submit.prompt_id] = []
        environment = ActivityEnvironment()
        environment.on_heartbeat = lambda *details: beats.append(details[0] if details else None)
        self.tasks[submit.prompt_id] = asyncio.create_task(
            environment.run(self._acts.wait, wait_request(submit))
        )

    def all_seen(self, phase: str) -> bool:
        return all(Progress(phase=phase) in beats for beats in self.heartbeats.values())

    async def results(self) -> dict[str, Any]:
        done = await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        return dict(zip(self.tasks, done, strict=True))


def requests(hits: Counter[str]) -> int:
    return sum(n for path, n in hits.items() if path != "GET /ws")


def history_reads(hits: Counter[str]) -> int:
    return sum(n for path, n in hits.items() if path.startswith("GET /history/"))


async def submitted(acts: ComfyUIActivities, run_activity, count: int, graph=VIDEO_GRAPH):
    job = f"job-{uuid.uuid4().hex[:8]}"
    reqs = [submit_request(f"{job}-{n}", graph) for n in range(count)]
    for req in reqs:
        posted, _ = await run_activity(acts.submit, req)
        assert posted.posted
    return reqs


@pytest.mark.full  # a scale test
async def test_two_hundred_waits_share_one_socket_and_one_queue_read_per_interval(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    comfyui.pause()
    acts = comfyui_activities(COMFYUI_HISTORY_POLL_S=POLL_S, heartbeat_every_s=1.0)
    reqs = await submitted(acts, run_activity, 200)
    failing = {r.prompt_id for r in reqs[::40]}  # five of them end in an execution error
    for prompt_id in failing:
        comfyui.fail_prompt(prompt_id, Failure("CUDA out of memory", "torch.OutOfMemoryError"))
    waiting = Waiting(acts)
    for req in reqs:
        waiting.start(req)
    await until(lambda: waiting.all_seen("queued"), timeout_s=20, what="every wait sees queued")

    before, intervals = requests(comfyui.hits), 10
    history_before = history_reads(comfyui.hits)
    await asyncio.sleep(intervals * POLL_S)
    per_interval = (requests(comfyui.hits) - before) / intervals
    print(f"\n200 waits: {comfyui.hits['GET /ws']} socket, {per_interval:.1f} requests/interval")
    assert comfyui.hits["GET /ws"] == 1
    assert per_interval <= 2  # one GET /queue a round; nothing per prompt while all are queued
    assert history_reads(comfyui.hits) == history_before

    comfyui.execution_s = 0
    comfyui.resume()
    results = await asyncio.wait_for(waiting.results(), 60)
    for prompt_id, result in results.items():
        if prompt_id in failing:
            assert isinstance(result, ApplicationError), result
            assert result.type == "ComfyUIExecutionFailed"
            assert "CUDA out of memory" in result.message
        else:
            assert isinstance(result, ComfyUIFinished) and result.outcome == "success", result
            assert [f.subfolder for f in result.files] == ["video"]
    assert comfyui.hits["GET /ws"] == 1
    # About one history read per prompt that ended: the socket says when, the poll covers it.
    ended_reads = history_reads(comfyui.hits) - history_before
    print(f"200 prompts ended: {ended_reads} history reads, {comfyui.hits['GET /queue']} queues")
    assert ended_reads <= 1.2 * len(reqs)


async def test_progress_of_each_prompt_reaches_only_its_own_wait(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    comfyui.execution_s = 0.4
    comfyui.progress_nodes.add("ImageBlur")
    comfyui.progress_steps = 2
    acts = comfyui_activities(heartbeat_every_s=0.01)  # progress shows at the regular beats
    reqs = await submitted(acts, run_activity, 2, SLOW_GRAPH)
    waiting = Waiting(acts)
    for req in reqs:
        waiting.start(req)
    results = await asyncio.wait_for(waiting.results(), 20)

    assert all(isinstance(r, ComfyUIFinished) and r.outcome == "success" for r in results.values())
    for req in reqs:
        beats = [b for b in waiting.heartbeats[req.prompt_id] if isinstance(b, Progress)]
        assert any(b.phase == "running" and b.node == "11" and b.max == 2 for b in beats)
    # The second prompt queued while the first ran; its wait said so before it ran.
    assert Progress(phase="queued") in waiting.heartbeats[reqs[1].prompt_id]


async def test_a_dropped_socket_is_reopened_and_the_waits_still_end_through_the_poll(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    comfyui.execution_s = 0.6
    acts = comfyui_activities(COMFYUI_HISTORY_POLL_S=POLL_S)
    reqs = await submitted(acts, run_activity, 3, SLOW_GRAPH)
    waiting = Waiting(acts)
    for req in reqs:
        waiting.start(req)
    await comfyui.wait_until(reqs[0].prompt_id, "running")
    comfyui.ws_silent_after = 1  # the new socket hears the greeting, then nothing
    await comfyui.drop_sockets()
    await until(lambda: comfyui.hits["GET /ws"] == 2, timeout_s=5, what="the socket reopened")
    results = await asyncio.wait_for(waiting.results(), 20)

    assert all(isinstance(r, ComfyUIFinished) and r.outcome == "success" for r in results.values())
    assert comfyui.ws_withheld > 0  # the ends came through the poll
    assert comfyui.hits["GET /ws"] == 2


async def test_comfyui_restarting_makes_every_waiting_prompt_lost(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    comfyui.execution_s = 5.0
    acts = comfyui_activities(COMFYUI_HISTORY_POLL_S=POLL_S)
    reqs = await submitted(acts, run_activity, 3, SLOW_GRAPH)  # one running, two pending
    waiting = Waiting(acts)
    for req in reqs:
        waiting.start(req)
    await comfyui.wait_until(reqs[0].prompt_id, "running")
    await until(lambda: waiting.all_seen("queued") or all(waiting.heartbeats.values()))
    await comfyui.restart(down_s=0.3)
    results = await asyncio.wait_for(waiting.results(), 20)

    assert results == {
        r.prompt_id: ComfyUIFinished(prompt_id=r.prompt_id, outcome="lost") for r in reqs
    }


async def test_a_prompt_missing_once_while_comfyui_is_down_is_not_lost(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    # Refused connections are no answer: they never count towards LOST, however long.
    comfyui.pause()
    acts = comfyui_activities(COMFYUI_HISTORY_POLL_S=POLL_S)
    [req] = await submitted(acts, run_activity, 1)
    waiting = Waiting(acts)
    waiting.start(req)
    await until(lambda: waiting.all_seen("queued"))
    comfyui.faults["/queue"] = "drop"
    await asyncio.sleep(5 * POLL_S)
    del comfyui.faults["/queue"]
    comfyui.execution_s = 0
    comfyui.resume()
    [result] = (await asyncio.wait_for(waiting.results(), 10)).values()
    assert isinstance(result, ComfyUIFinished) and result.outcome == "success"


async def test_a_wait_says_when_comfyui_went_silent_and_when_it_answers_again(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    comfyui.pause()
    acts = comfyui_activities(COMFYUI_HISTORY_POLL_S=POLL_S)
    [req] = await submitted(acts, run_activity, 1)
    comfyui.faults["/queue"] = "drop"
    before = datetime.now(UTC)
    silent = wait_request(req).model_copy(update={"report_silence_after_s": 1.0})
    reported, beats = await run_activity(acts.wait, silent)
    assert reported.outcome == "unreachable" and reported.silent_since is not None
    assert before <= reported.silent_since <= datetime.now(UTC) - timedelta(seconds=1)
    assert Progress(phase="ComfyUI not answering") in beats

    # Told of the silence, the next wait goes on counting from it and ends at the first answer.
    told = silent.model_copy(
        update={"silent_since": reported.silent_since, "report_silence_after_s": 3600.0}
    )
    back = asyncio.create_task(run_activity(acts.wait, told))
    await asyncio.sleep(3 * POLL_S)
    assert not back.done()
    del comfyui.faults["/queue"]
    result, _ = await asyncio.wait_for(back, 10)
    assert result == ComfyUIFinished(prompt_id=req.prompt_id, outcome="back")


async def test_a_prompt_over_before_its_wait_follows_it_ends_the_wait_before_the_next_round(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    # Rounds are at most five an interval: right after one, the next is poll_s / 5 away, and an
    # instant render's end came by the socket while nobody followed its prompt.
    poll_s = 30.0  # the next round 6 s away: a loaded machine's delays stay well inside it
    comfyui.pause()
    acts = comfyui_activities(COMFYUI_HISTORY_POLL_S=poll_s)
    [first] = await submitted(acts, run_activity, 1)
    waiting = Waiting(acts)
    waiting.start(first)
    await until(lambda: waiting.all_seen("queued"), what="a round saw the first prompt queued")
    comfyui.execution_s = 0
    comfyui.resume()
    await asyncio.wait_for(waiting.results(), 5)  # its end by the socket: no second round

    [req] = await submitted(acts, run_activity, 1)
    await comfyui.wait_until(req.prompt_id, "done")
    rounds = comfyui.hits["GET /queue"]
    started = asyncio.get_running_loop().time()
    result, _ = await asyncio.wait_for(run_activity(acts.wait, wait_request(req)), poll_s)
    took = asyncio.get_running_loop().time() - started

    assert isinstance(result, ComfyUIFinished) and result.outcome == "success"
    assert comfyui.hits["GET /queue"] == rounds  # its end came without a round
    assert took < 1.0, took


async def test_many_new_waits_at_once_read_a_history_each_at_most_a_few_at_a_time(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    comfyui.history_s = 0.05  # reads overlap, so the bound on them shows
    acts = comfyui_activities(COMFYUI_HISTORY_POLL_S=POLL_S)
    reqs = await submitted(acts, run_activity, 50)
    comfyui.execution_s = 0
    await comfyui.wait_until(reqs[-1].prompt_id, "done")
    before = history_reads(comfyui.hits)
    waiting = Waiting(acts)
    for req in reqs:
        waiting.start(req)
    results = await asyncio.wait_for(waiting.results(), 20)

    assert all(isinstance(r, ComfyUIFinished) and r.outcome == "success" for r in results.values())
    assert history_reads(comfyui.hits) - before <= len(reqs) + HISTORY_READS
    assert comfyui.most_history_reads <= HISTORY_READS


async def test_a_prompt_comfyui_never_saw_is_lost_only_after_two_rounds_an_interval_apart(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    # The wait's first look reads `{}` at once; that alone never makes the prompt lost.
    poll_s = 0.5
    acts = comfyui_activities(COMFYUI_HISTORY_POLL_S=poll_s)
    unknown = submit_request(f"job-{uuid.uuid4().hex[:8]}", VIDEO_GRAPH)
    started = asyncio.get_running_loop().time()
    result, _ = await run_activity(acts.wait, wait_request(unknown))
    took = asyncio.get_running_loop().time() - started

    assert result == ComfyUIFinished(prompt_id=unknown.prompt_id, outcome="lost")
    assert took >= poll_s
    assert comfyui.hits["GET /queue"] >= 2


async def test_two_waits_on_one_prompt_both_see_its_end(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    comfyui.execution_s = 0.2
    acts = comfyui_activities()
    [req] = await submitted(acts, run_activity, 1)
    first, second = (
        run_activity(acts.wait, wait_request(req)),
        run_activity(acts.wait, wait_request(req)),
    )
    (one, _), (two, _) = await asyncio.gather(first, second)
    assert one == two and isinstance(one, ComfyUIFinished) and one.outcome == "success"


async def test_an_idle_watcher_asks_comfyui_nothing(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    comfyui.execution_s = 0
    acts = comfyui_activities(COMFYUI_HISTORY_POLL_S=POLL_S)
    [req] = await submitted(acts, run_activity, 1)
    await run_activity(acts.wait, wait_request(req))
    before = requests(comfyui.hits)
    await asyncio.sleep(5 * POLL_S)
    assert requests(comfyui.hits) == before
    assert comfyui.hits["GET /ws"] == 1  # the socket stays, ready for the next prompt


async def test_closing_the_agent_ends_waits_still_following_with_a_retryable_error(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    comfyui.pause()
    acts = comfyui_activities()
    [req] = await submitted(acts, run_activity, 1)
    waiting = Waiting(acts)
    waiting.start(req)
    await until(lambda: waiting.all_seen("queued"))
    await acts.aclose()
    [result] = (await asyncio.wait_for(waiting.results(), 5)).values()
    assert isinstance(result, ApplicationError)
    assert result.type == "ComfyUIUnavailable" and not result.non_retryable


async def test_a_host_whose_every_poll_hangs_is_silent_from_the_first_failed_round(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    # A partition: no answer and no refusal; each round lasts its timeout, longer than the
    # interval between rounds, and the silence still counts from the first.
    comfyui.pause()
    acts = comfyui_activities(COMFYUI_HISTORY_POLL_S=POLL_S, COMFYUI_REQUEST_TIMEOUT_S=3 * POLL_S)
    [req] = await submitted(acts, run_activity, 1)
    comfyui.faults["/queue"] = "hang"
    before = datetime.now(UTC)
    silent = wait_request(req).model_copy(update={"report_silence_after_s": 2.0})
    reported, _ = await asyncio.wait_for(run_activity(acts.wait, silent), 30)
    assert reported.outcome == "unreachable" and reported.silent_since is not None
    assert before <= reported.silent_since <= before + timedelta(seconds=1)
