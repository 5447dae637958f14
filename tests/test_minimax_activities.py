"""The CLOUD route's activities against the MiniMax double over real loopback HTTP: the video
arrives, every refusal says what to do, and no failure ever leads to a second paid create."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.cloud.models import CloudCreate, CloudCreated, CloudDone, CloudDownload, CloudPoll
from activities.minimax.activities import MiniMaxActivities
from activities.minimax.answers import PERMANENT_CODES, RATE_LIMIT_CODES, SERVER_TROUBLE_CODES
from spillway.client.inputs import prepare_inputs
from spillway.core.hosts import WAITS_SUFFIX
from spillway.core.models import CloudRequest, Downloaded, JobInput
from spillway.sim.minimax import MiniMaxSim
from tests.support.activity import cancelled_in_flight, run_activity
from tests.support.cli import decoded
from tests.support.constants import CANARY_KEY
from tests.support.images import I2V_GRAPH, png
from tests.support.minimax import FAST, VIDEO_SIZE, BookLedger
from tests.support.workflows import CloudOnce, CreateOnce, CreateOnceInput

PROMPT = "a heron lifting off over a spillway at dawn"


def create_request(**cloud: object) -> CloudCreate:
    return CloudCreate(
        job_id=f"job-{uuid.uuid4().hex[:12]}",
        request=CloudRequest(prompt=PROMPT, **cloud),
        authorisation="approved",
    )


def app_error(result: object, type_: str) -> ApplicationError:
    assert isinstance(result, ApplicationError), result
    assert result.type == type_, f"{result.type}: {result}"
    return result


async def run_route(acts: MiniMaxActivities, run_activity, req: CloudCreate):
    created, create_beats = await run_activity(acts.create, req)
    assert isinstance(created, CloudCreated), created
    done, poll_beats = await run_activity(
        acts.poll, CloudPoll(job_id=req.job_id, task_id=created.task_id)
    )
    assert isinstance(done, CloudDone), done
    downloaded, download_beats = await run_activity(
        acts.download,
        CloudDownload(job_id=req.job_id, task_id=done.task_id, file_id=done.file_id),
    )
    return created, done, downloaded, create_beats + poll_beats + download_beats


def on_disk(path: Path) -> tuple[int, str, list[str]]:
    data = path.read_bytes()
    return (
        len(data),
        hashlib.sha256(data).hexdigest(),
        sorted(p.name for p in path.parent.iterdir()),
    )


# --- the happy path -------------------------------------------------------------------------


async def test_cloud_job_creates_polls_and_downloads_the_video_with_matching_sha256(
    minimax, minimax_activities, run_activity, tmp_path
):
    req = create_request(first_frame_image="https://example.org/first.png")
    acts = minimax_activities()
    created, done, downloaded, heartbeats = await run_route(acts, run_activity, req)

    assert created.create_calls == 1 and created.created_at is not None
    assert (done.video_width, done.video_height) == (1366, 768)
    [output] = downloaded.outputs
    path = Path(output.path)
    assert path.parent == (tmp_path / "outputs" / req.job_id).resolve()
    assert path.name == f"minimax-{created.task_id}.mp4"
    assert output.bytes == VIDEO_SIZE
    assert output.sha256 == minimax.sha256_of_task(created.task_id)
    assert on_disk(path) == (VIDEO_SIZE, output.sha256, [path.name])  # no temporary file left

    assert minimax.create_bodies == [
        {
            "model": "MiniMax-Hailuo-2.3",
            "prompt": PROMPT,
            "duration": 6,
            "resolution": "768P",
            "prompt_optimizer": True,
            "first_frame_image": "https://example.org/first.png",
        }
    ]
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)
    # The pre-signed URL is fetched without the key: it may live on another host.
    assert minimax.download_auth_headers == 0
    phases = [h.phase for h in heartbeats]
    for phase in ("creating", "Preparing", "Queueing", "Processing", "downloading"):
        assert phase in phases
    progress = [h for h in heartbeats if h.phase == "downloading"]
    assert progress[-1].value == VIDEO_SIZE and progress[-1].max == VIDEO_SIZE


async def test_full_cloud_route_through_temporal_keeps_the_key_out_of_history(
    env: WorkflowEnvironment, minimax, minimax_activities
):
    task_queue = f"minimax-{uuid.uuid4()}"
    acts = minimax_activities()
    req = create_request()
    async with (
        Worker(
            env.client,
            task_queue=task_queue,
            workflows=[CloudOnce],
            activities=[acts.create, acts.poll, acts.download],
        ),
        # Poll and download run on the waits queue, as in the real worker.
        Worker(
            env.client, task_queue=task_queue + WAITS_SUFFIX, activities=[acts.poll, acts.download]
        ),
    ):
        handle = await env.client.start_workflow(
            CloudOnce.run, req, id=req.job_id, task_queue=task_queue
        )
        downloaded = await handle.result()

    assert isinstance(downloaded, Downloaded)
    [task] = minimax.tasks.values()
    assert downloaded.outputs[0].sha256 == minimax.sha256_of_task(task.task_id)
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)
    history = decoded(json.loads((await handle.fetch_history()).to_json()))
    assert task.task_id in history and PROMPT in history  # payloads decoded: the check can see
    assert CANARY_KEY not in history


async def test_a_jobs_input_image_reaches_minimax_as_its_first_frame_and_nowhere_else(
    minimax, minimax_activities, minimax_settings, run_activity, tmp_path, caplog
):
    caplog.set_level(logging.DEBUG)
    frame, req = png(640, 480), create_request()
    (tmp_path / "start.png").write_bytes(frame)
    [item] = await prepare_inputs(
        minimax_settings(), req.job_id, I2V_GRAPH, [str(tmp_path / "start.png")], cloud=True
    )
    req = req.model_copy(update={"first_frame": item})
    created, done, downloaded, heartbeats = await run_route(minimax_activities(), run_activity, req)

    [body] = minimax.create_bodies
    prefix, _, encoded = body["first_frame_image"].partition(",")
    assert prefix == "data:image/png;base64"
    assert base64.b64decode(encoded) == frame
    assert downloaded.outputs[0].sha256 == minimax.sha256_of_task(created.task_id)
    seen = [created, done, downloaded, *heartbeats]
    assert not [thing for thing in seen if encoded[:40] in repr(thing)]
    assert encoded[:40] not in caplog.text


async def test_a_first_frame_at_a_url_is_passed_on_and_an_unreadable_one_sends_nothing(
    minimax, minimax_activities, run_activity
):
    url = "https://images.example.org/first.png"
    at_url = create_request().model_copy(update={"first_frame": JobInput(node="1", uri=url)})
    created, _ = await run_activity(minimax_activities().create, at_url)
    assert isinstance(created, CloudCreated), created
    assert minimax.create_bodies[0]["first_frame_image"] == url

    gone = JobInput(node="1", uri="file:///nowhere/first.png", sha256="0" * 64)
    req = create_request().model_copy(update={"first_frame": gone})
    ledger = BookLedger()
    result, _ = await run_activity(minimax_activities(ledger=ledger).create, req)
    error = app_error(result, "MiniMaxCreateGaveUp")
    assert "first frame" in error.message and "nothing was charged" in error.message
    assert minimax.create_calls == 1 and ledger.state_of(req.job_id) == "refused"


# --- MiniMax says no ------------------------------------------------------------------------


@pytest.mark.parametrize("code", sorted(PERMANENT_CODES))
async def test_permanent_create_code_fails_at_once_with_its_meaning_and_no_retry(
    minimax, minimax_activities, run_activity, code
):
    minimax.inject("create", code)
    result, _ = await run_activity(minimax_activities().create, create_request())

    error = app_error(result, "MiniMaxPermanent")
    assert error.non_retryable
    assert f"code {code}" in error.message and "resubmit" in error.message
    assert (minimax.create_calls, minimax.tasks_created) == (1, 0)


async def test_empty_balance_says_top_up_then_resubmit(minimax, minimax_activities, run_activity):
    minimax.inject("create", 1008)
    result, _ = await run_activity(minimax_activities().create, create_request())
    assert app_error(result, "MiniMaxPermanent").message.startswith(
        "MiniMax balance is empty (code 1008): top up, then resubmit the job"
    )


async def test_wrong_key_is_a_permanent_auth_failure_naming_the_setting(
    minimax, minimax_activities, run_activity
):
    acts = minimax_activities(MINIMAX_API_KEY="sk-someone-elses-key")
    result, _ = await run_activity(acts.create, create_request())
    error = app_error(result, "MiniMaxPermanent")
    assert "code 2049" in error.message and "MINIMAX_API_KEY" in error.message
    assert "sk-someone-elses-key" not in error.message
    assert minimax.create_calls == 1


@pytest.mark.parametrize("code", sorted(RATE_LIMIT_CODES))
async def test_rate_limit_code_without_task_is_retried_and_then_succeeds_with_one_task(
    minimax, minimax_activities, run_activity, code
):
    minimax.inject("create", code)
    created, heartbeats = await run_activity(minimax_activities().create, create_request())

    assert isinstance(created, CloudCreated), created
    assert created.create_calls == 2
    assert (minimax.create_calls, minimax.tasks_created) == (2, 1)
    assert "create_backoff" in [h.phase for h in heartbeats]
    gap = minimax.requests[1].at - minimax.requests[0].at
    assert gap >= 0.24  # FAST's rate-limit backoff (0.3 s ± 20 %), not its short one


@pytest.mark.parametrize("code", sorted(SERVER_TROUBLE_CODES))
async def test_server_trouble_code_on_a_create_is_ambiguous_and_never_resent(
    minimax, minimax_activities, run_activity, code
):
    # "unknown error", "timeout", "internal error": they do not prove no task was made.
    minimax.inject("create", code)
    ledger = BookLedger()
    req = create_request()
    result, _ = await run_activity(minimax_activities(ledger=ledger).create, req)

    error = app_error(result, "MiniMaxAmbiguousCreate")
    assert error.non_retryable and "a charge may exist" in error.message
    assert f"code {code}" in error.message
    assert minimax.create_calls == 1
    assert ledger.state_of(req.job_id) == "maybe_charged"


async def test_armed_create_on_a_worker_that_is_not_armed_now_sends_nothing(
    minimax, minimax_activities, run_activity
):
    # The job read an armed policy when it started; the worker was disarmed since.
    req = create_request().model_copy(update={"authorisation": "armed"})
    acts = minimax_activities(CLOUD_VIDEO_FALLBACK_ENABLED=False)
    result, _ = await run_activity(acts.create, req)

    error = app_error(result, "SpendNotArmed")
    assert error.non_retryable and "nothing was sent" in error.message
    assert minimax.create_calls == 0


async def test_reply_with_a_task_id_and_code_1001_is_ambiguous_and_never_resent(
    minimax, minimax_activities, run_activity
):
    minimax.inject("create", 1001, with_task=True)
    ledger = BookLedger()
    req = create_request()
    result, _ = await run_activity(minimax_activities(ledger=ledger).create, req)

    error = app_error(result, "MiniMaxAmbiguousCreate")
    [task] = minimax.tasks
    assert task in error.message and "a charge may exist" in error.message
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)
    assert ledger.state_of(req.job_id) == "maybe_charged"


async def test_create_refused_until_the_budget_ends_gives_up_saying_nothing_was_charged(
    minimax, minimax_activities, run_activity
):
    minimax.inject("create", 1002, times=1000)
    acts = minimax_activities(timing=replace(FAST, create_retry_budget_s=0.5))
    result, _ = await run_activity(acts.create, create_request())

    error = app_error(result, "MiniMaxCreateGaveUp")
    assert error.non_retryable and "nothing was charged" in error.message
    assert minimax.tasks_created == 0 and 2 <= minimax.create_calls <= 6


# --- money invariant 2: no second create after an ambiguous one ------------------------------


@pytest.mark.parametrize(
    "default_retry_policy", [False, True], ids=["max_attempts_1", "default_policy"]
)
async def test_create_hanging_after_minimax_received_it_fails_ambiguous_and_is_never_resent(
    env: WorkflowEnvironment, minimax, minimax_activities, default_retry_policy
):
    minimax.fault_next_create("hang")  # MiniMax made the task; its answer never comes
    task_queue = f"minimax-{uuid.uuid4()}"
    acts = minimax_activities()
    req = create_request()
    async with Worker(
        env.client, task_queue=task_queue, workflows=[CreateOnce], activities=[acts.create]
    ):
        handle = await env.client.start_workflow(
            CreateOnce.run,
            CreateOnceInput(create=req, default_retry_policy=default_retry_policy),
            id=req.job_id,
            task_queue=task_queue,
        )
        with pytest.raises(WorkflowFailureError) as failure:
            await handle.result()
        await asyncio.sleep(0.3)  # time for a retry that must not happen

    activity_error = failure.value.cause
    assert isinstance(activity_error, ActivityError)
    error = app_error(activity_error.cause, "MiniMaxAmbiguousCreate")
    assert error.non_retryable
    message = error.message
    assert "a charge may exist" in message and req.job_id in message
    assert "UTC" in message and "will not create again" in message
    assert "no answer within 0.5s" in message
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)
    history = await handle.fetch_history()
    attempts = [e for e in history.events if e.HasField("activity_task_started_event_attributes")]
    assert [a.activity_task_started_event_attributes.attempt for a in attempts] == [1]


@pytest.mark.parametrize("creates_task", [True, False], ids=["task_made", "task_not_made"])
async def test_connection_dropped_after_the_create_was_sent_is_ambiguous_and_not_resent(
    minimax, minimax_activities, run_activity, creates_task
):
    minimax.fault_next_create("drop", creates_task=creates_task)
    req = create_request()
    result, _ = await run_activity(minimax_activities().create, req)

    error = app_error(result, "MiniMaxAmbiguousCreate")
    assert error.non_retryable and "a charge may exist" in error.message
    assert "connection failed after the request was sent" in error.message
    assert minimax.create_calls == 1 and minimax.tasks_created == int(creates_task)


@pytest.mark.parametrize("fault", ["hang", "drop", "http500", "garbage", "html"])
async def test_create_without_a_readable_minimax_answer_is_ambiguous_and_not_resent(
    minimax, minimax_activities, run_activity, fault
):
    minimax.faults["/v1/video_generation"] = fault
    result, _ = await run_activity(minimax_activities().create, create_request())

    error = app_error(result, "MiniMaxAmbiguousCreate")
    assert error.non_retryable and "a charge may exist" in error.message
    assert minimax.create_calls == 1


async def test_create_cancelled_with_the_request_in_flight_reports_ambiguous_not_cancelled(
    minimax, minimax_activities
):
    # A worker shutting down cancels its activities: the request may already be at MiniMax.
    minimax.fault_next_create("hang")
    acts = minimax_activities(MINIMAX_CREATE_TIMEOUT_S=30)
    error = await cancelled_in_flight(
        acts.create, create_request(), sent=lambda: minimax.create_bodies
    )

    assert error.type == "MiniMaxAmbiguousCreate" and error.non_retryable
    assert "cancelled while the request was in flight" in error.message
    assert minimax.create_calls == 1


async def test_connection_refused_before_sending_is_retried_safely_until_minimax_is_back(
    minimax, minimax_activities, run_activity
):
    acts = minimax_activities()
    await minimax.stop()  # same port, nothing listening: nothing can be sent
    running = asyncio.create_task(run_activity(acts.create, create_request()))
    await asyncio.sleep(0.3)
    await minimax.start()
    created, _ = await running

    assert isinstance(created, CloudCreated), created
    assert created.create_calls >= 3
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)


async def test_minimax_unreachable_for_the_whole_budget_gives_up_saying_nothing_was_sent(
    minimax_activities, run_activity, refused_url
):
    acts = minimax_activities(
        timing=replace(FAST, create_retry_budget_s=0.3),
        MINIMAX_BASE_URL=refused_url,
    )
    result, _ = await run_activity(acts.create, create_request())
    error = app_error(result, "MiniMaxCreateGaveUp")
    assert "could not connect" in error.message and "nothing was charged" in error.message


# --- no key ---------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [None, "", "   "])
async def test_missing_key_fails_naming_minimax_api_key_without_any_http_call(
    minimax, minimax_activities, run_activity, key
):
    acts = minimax_activities(MINIMAX_API_KEY=key)
    created, _ = await run_activity(acts.create, create_request())
    polled, _ = await run_activity(acts.poll, CloudPoll(job_id="job-1", task_id="1"))

    error = app_error(created, "MiniMaxNoKey")
    assert error.non_retryable and "MINIMAX_API_KEY" in error.message
    # The task of a poll exists and is paid for: a worker with the key may still fetch it.
    assert not app_error(polled, "MiniMaxNoKey").non_retryable
    assert sum(minimax.hits.values()) == 0


async def test_key_with_a_line_break_is_refused_before_any_request(
    minimax, minimax_activities, run_activity
):
    acts = minimax_activities(MINIMAX_API_KEY=f"{CANARY_KEY}\nX-Injected: 1")
    result, _ = await run_activity(acts.create, create_request())
    error = app_error(result, "MiniMaxNoKey")
    assert "MINIMAX_API_KEY" in error.message and CANARY_KEY not in error.message
    assert sum(minimax.hits.values()) == 0


# --- polling --------------------------------------------------------------------------------


async def created_task(acts: MiniMaxActivities) -> CloudPoll:
    """A task made through the create activity: the poll that follows it."""
    created, _ = await run_activity(acts.create, create_request())
    assert isinstance(created, CloudCreated), created
    return CloudPoll(job_id="job-1", task_id=created.task_id)


async def polled_after_code(
    minimax: MiniMaxSim, acts: MiniMaxActivities, code: int
) -> tuple[CloudPoll, object]:
    """A task made, then polled with MiniMax answering the first query with the error `code`: the
    poll and what the poll activity returned."""
    poll = await created_task(acts)
    minimax.inject("query", code)
    result, _ = await run_activity(acts.poll, poll)
    return poll, result


async def test_task_that_fails_at_minimax_fails_with_minimax_message(
    minimax, minimax_activities, run_activity
):
    minimax.fail_with("video generation failed: the scene could not be rendered")
    acts = minimax_activities()
    poll = await created_task(acts)
    result, heartbeats = await run_activity(acts.poll, poll)

    error = app_error(result, "MiniMaxTaskFailed")
    assert error.non_retryable
    assert "the scene could not be rendered" in error.message and poll.task_id in error.message
    assert "Processing" in [h.phase for h in heartbeats]


class PausesTaken:
    """`asyncio` as the MiniMax activities see it, noting every pause they ask for: the pause
    chosen, not the time a busy machine took to come back from it."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    def __getattr__(self, name: str) -> object:
        return getattr(asyncio, name)

    async def sleep(self, delay: float) -> None:
        self.asked.append(delay)
        await asyncio.sleep(delay)


async def test_rate_limit_during_poll_backs_off_and_continues(
    minimax, minimax_activities, monkeypatch
):
    acts = minimax_activities()
    pauses = PausesTaken()
    monkeypatch.setattr("activities.minimax.activities.asyncio", pauses)
    _, done = await polled_after_code(minimax, acts, 1002)

    assert isinstance(done, CloudDone), done
    queries = [r.at for r in minimax.requests if r.endpoint == "query"]
    assert len(queries) == 5  # the refused one, then Preparing ... Success
    interval = acts._settings.MINIMAX_POLL_INTERVAL_S
    # Doubled after the refusal, then back to the interval: the rest of the pauses are polls.
    assert pauses.asked[:2] == [2 * interval, interval], pauses.asked


async def test_permanent_code_while_polling_fails_naming_the_task_that_exists(
    minimax, minimax_activities
):
    poll, result = await polled_after_code(minimax, minimax_activities(), 1004)

    error = app_error(result, "MiniMaxPermanent")
    assert error.non_retryable and poll.task_id in error.message and "code 1004" in error.message


async def test_network_error_while_polling_is_retryable(minimax, minimax_activities, run_activity):
    acts = minimax_activities()
    await minimax.stop()
    result, _ = await run_activity(acts.poll, CloudPoll(job_id="job-1", task_id="42"))
    assert not app_error(result, "MiniMaxUnavailable").non_retryable


# --- downloading ----------------------------------------------------------------------------


async def finished_task(minimax, acts, run_activity) -> tuple[CloudCreate, CloudDone]:
    minimax.set_statuses(["Success"])
    req = create_request()
    created, _ = await run_activity(acts.create, req)
    done, _ = await run_activity(acts.poll, CloudPoll(job_id=req.job_id, task_id=created.task_id))
    return req, done


@pytest.mark.parametrize("status", [403, 404, 410])
async def test_expired_download_url_is_fetched_again_through_retrieve(
    minimax, minimax_activities, run_activity, status
):
    acts = minimax_activities()
    req, done = await finished_task(minimax, acts, run_activity)
    minimax.expire_next_urls(1, status=status)
    downloaded, _ = await run_activity(
        acts.download,
        CloudDownload(job_id=req.job_id, task_id=done.task_id, file_id=done.file_id),
    )

    assert isinstance(downloaded, Downloaded), downloaded
    assert downloaded.outputs[0].sha256 == minimax.sha256_of_task(done.task_id)
    assert (minimax.retrieve_hits, minimax.download_hits) == (2, 2)


async def test_download_rerun_does_not_fetch_a_completed_file_twice(
    minimax, minimax_activities, run_activity
):
    acts = minimax_activities()
    req, done = await finished_task(minimax, acts, run_activity)
    download = CloudDownload(job_id=req.job_id, task_id=done.task_id, file_id=done.file_id)
    first, _ = await run_activity(acts.download, download)
    again, _ = await run_activity(acts.download, download)

    assert first == again
    assert (minimax.retrieve_hits, minimax.download_hits) == (1, 1)


async def test_hostile_filename_cannot_place_the_video_outside_the_job_folder(
    minimax, minimax_activities, run_activity, tmp_path
):
    minimax.filename = "../../../escaped.sh"
    acts = minimax_activities()
    req, done = await finished_task(minimax, acts, run_activity)
    downloaded, _ = await run_activity(
        acts.download,
        CloudDownload(job_id=req.job_id, task_id=done.task_id, file_id=done.file_id),
    )

    path = Path(downloaded.outputs[0].path)
    assert path.parent == (tmp_path / "outputs" / req.job_id).resolve()
    assert path.name == f"minimax-{done.task_id}.mp4"
    assert not list(tmp_path.rglob("escaped*"))


async def test_retrieve_of_an_unknown_file_fails_and_leaves_nothing_behind(
    minimax, minimax_activities, run_activity, tmp_path
):
    result, _ = await run_activity(
        minimax_activities().download, CloudDownload(job_id="job-x", task_id="1", file_id="999")
    )
    assert app_error(result, "MiniMaxPermanent").non_retryable  # 2013: no such file
    assert not list((tmp_path / "outputs").rglob("*"))


# --- money invariant 3: the key stays in the worker's environment ----------------------------


async def test_key_never_appears_in_results_errors_heartbeats_or_logs(
    minimax, minimax_activities, run_activity, caplog
):
    caplog.set_level(logging.DEBUG)
    acts = minimax_activities()
    seen: list[object] = []

    created, done, downloaded, heartbeats = await run_route(acts, run_activity, create_request())
    seen += [created, done, downloaded, *heartbeats]
    minimax.inject("create", 1002)
    minimax.inject("create", 1008)
    minimax.fault_next_create("drop")
    minimax.fail_with("render failed")
    for _ in range(2):
        result, beats = await run_activity(acts.create, create_request())
        seen += [result, getattr(result, "details", None), *beats]
    created, _ = await run_activity(acts.create, create_request())
    failed, beats = await run_activity(acts.poll, CloudPoll(job_id="j", task_id=created.task_id))
    seen += [failed, failed.details, *beats]
    wrong = minimax_activities(MINIMAX_API_KEY=f"{CANARY_KEY}-rotated")
    result, _ = await run_activity(wrong.create, create_request())
    seen += [result, result.details]

    assert any(isinstance(s, ApplicationError) for s in seen)
    text = "\n".join(f"{s!r} {s}" for s in seen)
    assert CANARY_KEY not in text
    assert caplog.records and CANARY_KEY not in caplog.text
    assert minimax.tasks_created == 3
