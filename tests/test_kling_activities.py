"""The CLOUD route's Kling activities against the Kling double over real loopback HTTP, with the
spend ledger's own rules in process: the video arrives, every refusal says what to do, an
unanswered create is settled by asking Kling for its external id, no failure or repeat ever
makes a second task, and no key or token shows anywhere."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import logging
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities.cloud.models import (
    CloudCreate,
    CloudCreated,
    CloudDone,
    CloudDownload,
    CloudPoll,
    LostCreate,
    Reconciled,
)
from activities.kling.activities import KlingActivities
from activities.kling.client import KlingClient
from activities.kling.requests import sign_jwt
from spillway.client.inputs import prepare_inputs
from spillway.core.ledger import SettleRequest, SpendEntry
from spillway.core.models import CloudRequest, Downloaded, JobInput
from spillway.core.names import run_tag
from spillway.sim.kling import KlingSim
from tests.support.activity import cancelled_in_flight, run_activity
from tests.support.images import I2V_GRAPH, png, webp
from tests.support.kling import (
    CANARY_ACCESS,
    CANARY_SECRET,
    FAST,
    VIDEO_SIZE,
    KlingBookLedger,
)

PROMPT = "a heron lifting off over a spillway at dawn"
PNG = (  # Kling's own example of a bare base64 image
    "iVBORw0KGgoAAAANSUhEUgAAAAUAAAAFCAYAAACNbyblAAAAHElEQVQI12P4//8/w38GIAXDIBKE0DHxgljNBAAO9TXL0Y4OHwAAAABJRU5ErkJggg=="
)
RUN = "test-run"  # ActivityEnvironment's workflow run id


def create_request(**cloud: Any) -> CloudCreate:
    return CloudCreate(
        job_id=f"job-{uuid.uuid4().hex[:12]}",
        request=CloudRequest(prompt=PROMPT, **cloud),
        authorisation="approved",
    )


def external_id(req: CloudCreate) -> str:
    return f"spillway-{req.job_id}-{run_tag(RUN)}"


def app_error(result: object, type_: str) -> ApplicationError:
    assert isinstance(result, ApplicationError), result
    assert result.type == type_, f"{result.type}: {result}"
    return result


def no_secrets(*things: object) -> None:
    for thing in things:
        for text in (str(thing), repr(thing)):
            assert "CANARY" not in text, text
            assert "eyJ" not in text, text  # a JWT names the access key


async def run_route(
    acts: KlingActivities, req: CloudCreate
) -> tuple[CloudCreated, CloudDone, Downloaded, list[Any]]:
    created, create_beats = await run_activity(acts.create, req)
    assert isinstance(created, CloudCreated), created
    poll = CloudPoll(job_id=req.job_id, task_id=created.task_id)
    done, poll_beats = await run_activity(acts.poll, poll)
    assert isinstance(done, CloudDone), done
    download = CloudDownload(job_id=req.job_id, task_id=done.task_id, video_url=done.video_url)
    downloaded, download_beats = await run_activity(acts.download, download)
    assert isinstance(downloaded, Downloaded), downloaded
    return created, done, downloaded, create_beats + poll_beats + download_beats


def on_disk(path: Path) -> tuple[int, str, list[str]]:
    data = path.read_bytes()
    names = sorted(p.name for p in path.parent.iterdir())
    return len(data), hashlib.sha256(data).hexdigest(), names


def client_of(kling: KlingSim, http: Any) -> KlingClient:
    return KlingClient(http, kling.url, CANARY_ACCESS, CANARY_SECRET, FAST)


# --- the happy paths ---------------------------------------------------------------------------


async def test_text_job_creates_polls_and_downloads_the_video_with_the_doubles_sha256(
    kling, kling_activities, tmp_path, caplog
):
    caplog.set_level(logging.DEBUG)
    ledger = KlingBookLedger()
    req = create_request()
    created, done, downloaded, heartbeats = await run_route(kling_activities(ledger=ledger), req)

    assert created.create_calls == 1 and created.created_at is not None and created.settled
    [task] = kling.tasks.values()
    assert created.task_id == done.task_id == task.task_id
    assert kling.create_bodies == [
        {
            "model_name": "kling-v2-6",
            "prompt": PROMPT,
            "aspect_ratio": "16:9",
            "mode": "std",
            "duration": "5",  # MiniMax's default 6 s is Kling's 5 s
            "external_task_id": external_id(req),
        }
    ]
    [output] = downloaded.outputs
    path = Path(output.path)
    assert path.parent == (tmp_path / "outputs" / req.job_id).resolve()
    assert path.name == f"kling-{task.task_id}.mp4"
    assert output.bytes == VIDEO_SIZE and output.sha256 == kling.sha256_of_task(task.task_id)
    assert on_disk(path) == (VIDEO_SIZE, output.sha256, [path.name])  # no partial file left
    assert (kling.create_calls, kling.tasks_created) == (1, 1)
    assert kling.auth_headers["download"] == [""]  # the CDN URL gets no key and no token
    assert done.cost_usd is None  # Kling reports units, not dollars (see activities/kling.py)

    entry = ledger.entry_of(req.job_id)
    assert entry is not None and (entry.state, entry.task_id) == ("charged", task.task_id)
    phases = [h.phase for h in heartbeats]
    for phase in ("creating", "submitted", "processing", "downloading"):
        assert phase in phases
    no_secrets(created, done, downloaded, heartbeats, caplog.text)


async def test_job_with_a_first_frame_is_rendered_by_image2video(kling, kling_activities):
    req = create_request(first_frame_image=f"data:image/png;base64,{PNG}", duration=10)
    created, _, downloaded, _ = await run_route(kling_activities(), req)

    [body] = kling.create_bodies
    assert kling.hits["POST /v1/videos/image2video"] == 1
    assert (body["image"], body["duration"], body["prompt"]) == (PNG, "10", PROMPT)
    assert "aspect_ratio" not in body  # the video takes the image's shape
    # The poll found the task under image2video though CloudPoll names no kind.
    assert kling.tasks[created.task_id].kind == "image2video"
    assert downloaded.outputs[0].sha256 == kling.sha256_of_task(created.task_id)


async def with_first_frame(
    kling_settings: Any, tmp_path: Path, name: str, data: bytes
) -> CloudCreate:
    """A request whose first frame is the job's input image, stored as `submit` stores it."""
    req = create_request()
    (tmp_path / name).write_bytes(data)
    [item] = await prepare_inputs(
        kling_settings(), req.job_id, I2V_GRAPH, [str(tmp_path / name)], cloud=True
    )
    return req.model_copy(update={"first_frame": item})


async def test_a_jobs_stored_input_image_is_sent_as_bare_base64_to_image2video(
    kling, kling_activities, kling_settings, tmp_path, caplog
):
    caplog.set_level(logging.DEBUG)
    frame = png(640, 480)
    req = await with_first_frame(kling_settings, tmp_path, "start.png", frame)
    created, _, downloaded, heartbeats = await run_route(kling_activities(), req)

    [body] = kling.create_bodies
    assert kling.hits["POST /v1/videos/image2video"] == 1
    assert base64.b64decode(body["image"]) == frame
    assert downloaded.outputs[0].sha256 == kling.sha256_of_task(created.task_id)
    encoded = body["image"][:40]  # the bytes appear nowhere but in the request
    assert not [h for h in [created, downloaded, *heartbeats] if encoded in repr(h)]
    assert encoded not in caplog.text


async def test_a_first_frame_kling_cannot_take_or_read_is_refused_before_anything_is_sent(
    kling, kling_activities, kling_settings, tmp_path
):
    webp_frame = await with_first_frame(kling_settings, tmp_path, "a.webp", webp(640, 480))
    unreadable = create_request().model_copy(
        update={"first_frame": JobInput(node="1", uri="file:///etc/passwd", sha256="0" * 64)}
    )
    for req, says in [(webp_frame, "JPG or PNG"), (unreadable, "outside SPILLWAY_OUTPUT_DIR")]:
        ledger = KlingBookLedger()
        result, _ = await run_activity(kling_activities(ledger=ledger).create, req)
        error = app_error(result, "KlingRefused")
        assert says in error.message and "nothing was sent" in error.message
        assert ledger.state_of(req.job_id) == "refused"
    assert kling.create_calls == 0


async def test_units_kling_reports_are_returned_and_logged_and_never_taken_for_dollars(
    kling, kling_activities, caplog
):
    caplog.set_level(logging.INFO)
    kling.units = "1.5"
    acts = kling_activities()
    created, _ = await run_activity(acts.create, create_request())
    done, _ = await run_activity(acts.poll, CloudPoll(job_id="job-1", task_id=created.task_id))

    assert isinstance(done, CloudDone) and (done.cost_usd, done.units) == (None, 1.5)
    assert "used 1.5 resource-pack units" in caplog.text


# --- Kling says no --------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [1100, 1101, 1102])
async def test_account_or_resource_pack_refusal_makes_nothing_and_settles_refused(
    kling, kling_activities, code
):
    kling.refuse_next_creates(code)
    ledger = KlingBookLedger()
    req = create_request()
    result, _ = await run_activity(kling_activities(ledger=ledger).create, req)

    error = app_error(result, "KlingRefused")
    assert error.non_retryable
    assert f"Kling code {code}" in error.message
    assert "made no task and charged nothing" in error.message
    assert "next cloud provider" in error.message
    assert (kling.create_calls, kling.tasks_created) == (1, 0)
    assert ledger.state_of(req.job_id) == "refused"


async def test_used_up_resource_pack_1102_says_to_buy_or_renew_one(kling, kling_activities):
    kling.refuse_next_creates(1102)
    result, _ = await run_activity(kling_activities().create, create_request())
    assert "buy or renew a Kling resource pack" in app_error(result, "KlingRefused").message


async def test_wrong_secret_is_refused_naming_both_settings_and_showing_neither(
    kling, kling_activities
):
    acts = kling_activities(KLING_SECRET_KEY="kling-CANARY-not-the-secret")
    result, _ = await run_activity(acts.create, create_request())

    error = app_error(result, "KlingRefused")
    assert "code 1002" in error.message
    assert "KLING_ACCESS_KEY" in error.message and "KLING_SECRET_KEY" in error.message
    assert kling.tasks_created == 0
    no_secrets(error, error.details)


async def test_parallel_task_limit_1303_is_sent_again_after_a_backoff_and_makes_one_task(
    kling, kling_activities
):
    kling.refuse_next_creates(1303)
    ledger = KlingBookLedger()
    req = create_request()
    created, heartbeats = await run_activity(kling_activities(ledger=ledger).create, req)

    assert isinstance(created, CloudCreated), created
    assert created.create_calls == 2
    assert (kling.create_calls, kling.tasks_created) == (2, 1)
    assert "create_backoff" in [h.phase for h in heartbeats]
    assert ledger.state_of(req.job_id) == "charged"


async def test_kling_unreachable_for_the_whole_budget_gives_up_saying_nothing_was_charged(
    kling_activities, refused_url
):
    ledger = KlingBookLedger()
    req = create_request()
    acts = kling_activities(
        timing=dataclasses.replace(FAST, create_retry_budget_s=0.3),
        ledger=ledger,
        KLING_BASE_URL=refused_url,
    )
    result, _ = await run_activity(acts.create, req)

    error = app_error(result, "KlingCreateGaveUp")
    assert error.non_retryable
    assert "could not connect" in error.message and "nothing was charged" in error.message
    assert ledger.state_of(req.job_id) == "refused"


async def test_an_image_kling_cannot_read_is_refused_before_anything_is_sent(
    kling, kling_activities
):
    ledger = KlingBookLedger()
    req = create_request(first_frame_image="data:image/webp;base64,UklGRg==")
    result, _ = await run_activity(kling_activities(ledger=ledger).create, req)

    error = app_error(result, "KlingRefused")
    assert "JPG or PNG" in error.message and "nothing was sent" in error.message
    assert kling.create_calls == 0
    assert ledger.state_of(req.job_id) == "refused"


async def test_missing_keys_fail_naming_both_variables_without_any_request(kling, kling_activities):
    acts = kling_activities(KLING_ACCESS_KEY=None, KLING_SECRET_KEY=None)
    created, _ = await run_activity(acts.create, create_request())
    polled, _ = await run_activity(acts.poll, CloudPoll(job_id="job-1", task_id="1"))

    error = app_error(created, "KlingNoKey")
    assert error.non_retryable
    assert "KLING_ACCESS_KEY" in error.message and "KLING_SECRET_KEY" in error.message
    assert "nothing was sent" in error.message
    # The task of a poll exists and is paid for: a worker with the keys may still follow it.
    assert not app_error(polled, "KlingNoKey").non_retryable
    assert sum(kling.hits.values()) == 0


async def test_armed_create_on_a_worker_that_is_not_armed_now_sends_nothing(
    kling, kling_activities
):
    req = create_request().model_copy(update={"authorisation": "armed"})
    result, _ = await run_activity(kling_activities(CLOUD_VIDEO_FALLBACK_ENABLED=False).create, req)

    assert app_error(result, "SpendNotArmed").non_retryable
    assert kling.create_calls == 0


# --- money invariant 2: an unclear create is settled by asking Kling, never made twice ----------


@pytest.mark.parametrize("fault", ["hang", "drop"])
async def test_create_lost_after_the_task_was_made_is_reconciled_to_that_one_task(
    kling, kling_activities, fault
):
    kling.fault_next_create(fault, creates_task=True)  # Kling made it; its answer never comes
    ledger = KlingBookLedger()
    req = create_request()
    created, heartbeats = await run_activity(kling_activities(ledger=ledger).create, req)

    assert isinstance(created, CloudCreated), created
    [task] = kling.tasks.values()
    assert created.task_id == task.task_id and task.external_task_id == external_id(req)
    assert (kling.create_calls, kling.tasks_created) == (1, 1)
    assert created.create_calls == 1 and created.created_at is not None
    assert "reconciling" in [h.phase for h in heartbeats]
    entry = ledger.entry_of(req.job_id)
    assert entry is not None and (entry.state, entry.task_id) == ("charged", task.task_id)


async def test_create_lost_before_any_task_was_made_is_sent_again_with_the_same_external_id(
    kling, kling_activities
):
    kling.fault_next_create("drop", creates_task=False)
    req = create_request()
    created, _ = await run_activity(kling_activities().create, req)

    assert isinstance(created, CloudCreated), created
    assert (kling.create_calls, kling.tasks_created) == (2, 1)
    assert [b["external_task_id"] for b in kling.create_bodies] == [external_id(req)] * 2


async def test_create_kling_cannot_be_asked_about_stays_ambiguous_and_says_how_to_check(
    kling, kling_activities
):
    req = create_request()
    kling.fault_next_create("hang", creates_task=True)
    kling.faults[f"/v1/videos/text2video/{external_id(req)}"] = "http500"
    ledger = KlingBookLedger()
    acts = kling_activities(
        timing=dataclasses.replace(FAST, create_retry_budget_s=1.0), ledger=ledger
    )
    result, _ = await run_activity(acts.create, req)

    error = app_error(result, "KlingAmbiguousCreate")
    assert error.non_retryable and "a charge may exist" in error.message
    assert external_id(req) in error.message and "UTC" in error.message
    assert f"/v1/videos/text2video/{external_id(req)}" in error.message
    assert "will not create again" in error.message
    assert (kling.create_calls, kling.tasks_created) == (1, 1)
    assert ledger.state_of(req.job_id) == "maybe_charged"


async def first_create(
    kling_activities: Callable[..., KlingActivities], ledger: KlingBookLedger
) -> tuple[KlingActivities, CloudCreate, object]:
    """A new job's create, attempt 1, on `ledger`: the activities and the request, for the create
    to run again, and what this one returned (or raised)."""
    acts = kling_activities(ledger=ledger)
    req = create_request()
    result, _ = await run_activity(acts.create, req)
    return acts, req, result


async def test_repeated_create_of_the_same_run_is_refused_by_the_ledger_and_makes_no_second_task(
    kling, kling_activities
):
    acts, req, created = await first_create(kling_activities, KlingBookLedger())
    assert isinstance(created, CloudCreated), created

    again, _ = await run_activity(acts.create, req, attempt=2)

    error = app_error(again, "SpendRefused")
    assert error.non_retryable and "nothing was sent" in error.message
    [details] = error.details
    assert details["kind"] == "exists" and details["entry"]["task_id"] == created.task_id
    assert (kling.create_calls, kling.tasks_created) == (1, 1)


async def test_another_create_naming_the_same_attempt_is_refused_before_it_reaches_kling(
    kling, kling_activities
):
    # The same attempt asking the ledger again (its first answer was lost) holds the token it
    # began with; a second create naming that attempt (read off Temporal) draws its own and is
    # refused: nothing reaches Kling.
    ledger = KlingBookLedger()
    acts, req, first = await first_create(kling_activities, ledger)
    second, _ = await run_activity(acts.create, req)

    assert isinstance(first, CloudCreated), first
    assert isinstance(second, ApplicationError) and "with another token" in str(second), second
    assert "nothing was sent" in str(second)
    assert (kling.create_calls, kling.tasks_created) == (1, 1)
    assert ledger.state_of(req.job_id) == "charged"


class WorkerKilled(Exception):
    """Stands for the worker's process ending: nothing after it in the activity runs."""


class KilledBeforeSettling(KlingBookLedger):
    async def settle(self, req: SettleRequest) -> SpendEntry:
        raise WorkerKilled("the worker died after Kling answered, before the ledger heard")


async def test_worker_killed_between_klings_answer_and_completion_never_makes_a_second_task(
    kling, kling_activities, http
):
    ledger = KilledBeforeSettling()
    acts, req, killed = await first_create(kling_activities, ledger)
    assert isinstance(killed, WorkerKilled), killed
    [task] = kling.tasks.values()  # Kling made it; the run never learned its id
    entry = ledger.entry_of(req.job_id)
    assert entry is not None and (entry.state, entry.sent_at is not None) == ("reserved", True)

    retried, _ = await run_activity(acts.create, req, attempt=2)

    error = app_error(retried, "SpendRefused")
    assert "may not create again" in error.message and "nothing was sent" in error.message
    assert (kling.create_calls, kling.tasks_created) == (1, 1)
    # What the job's follow-up (or a person) does: ask Kling by the run's external id.
    found = await client_of(kling, http).reconcile("text2video", external_id(req))
    assert (found.outcome, found.task_id) == ("created", task.task_id)


# --- a create whose worker was lost: reconciled by the workflow -----------------------------------


def lost(req: CloudCreate, sent_s_ago: float) -> LostCreate:
    sent_at = datetime.now(UTC) - timedelta(seconds=sent_s_ago)
    return LostCreate(
        job_id=req.job_id, request=req.request, first_frame=False, run_id=RUN, sent_at=sent_at
    )


async def test_a_create_whose_worker_was_lost_is_reconciled_to_the_task_kling_made(
    kling, kling_activities
):
    acts, req, killed = await first_create(kling_activities, KilledBeforeSettling())
    assert isinstance(killed, WorkerKilled), killed
    [task] = kling.tasks.values()

    # Asked from another run (a reset job's): the id is the one of the run that sent it.
    found, heartbeats = await run_activity(acts.reconcile, lost(req, 1), workflow_run_id="reset")

    assert found == Reconciled(external_task_id=external_id(req), task_id=task.task_id)
    assert (kling.create_calls, kling.tasks_created) == (1, 1)  # asked, never created again
    assert "reconciling" in [h.phase for h in heartbeats]


async def test_no_task_is_an_answer_only_once_the_lost_create_can_no_longer_land(
    kling, kling_activities
):
    acts, req = kling_activities(), create_request()
    # Its last request could still land for another 0.5 s (FAST: 8 s after the first): Kling is
    # asked again until then.
    found, _ = await run_activity(acts.reconcile, lost(req, FAST.longest_create_s() - 0.5))
    assert found == Reconciled(external_task_id=external_id(req))
    assert kling.query_hits >= 2

    asked = kling.query_hits
    found, _ = await run_activity(acts.reconcile, lost(req, 60))  # long over: one look
    assert found == Reconciled(external_task_id=external_id(req))
    assert kling.query_hits - asked == 2  # one look by each id it may carry (0.2.0's too)
    assert kling.create_calls == 0


async def test_kling_refusing_to_say_what_a_lost_create_made_fails_for_good_showing_no_key(
    kling, kling_activities
):
    acts = kling_activities(KLING_SECRET_KEY="kling-CANARY-not-the-secret")
    result, _ = await run_activity(acts.reconcile, lost(create_request(), 60))

    error = app_error(result, "KlingRefused")
    assert error.non_retryable and "KLING_SECRET_KEY" in error.message
    no_secrets(error, error.details)


async def test_create_cancelled_with_the_request_in_flight_reports_ambiguous_not_cancelled(
    kling, kling_activities
):
    # A worker shutting down past its grace cancels the create: the request may be at Kling.
    kling.fault_next_create("hang")
    ledger = KlingBookLedger()
    acts = kling_activities(timing=dataclasses.replace(FAST, create_timeout_s=30), ledger=ledger)
    req = create_request()
    error = await cancelled_in_flight(acts.create, req, sent=lambda: kling.create_bodies)

    assert error.type == "KlingAmbiguousCreate" and error.non_retryable
    assert "cancelled while the create was under way" in error.message
    assert kling.create_calls == 1
    assert ledger.state_of(req.job_id) == "maybe_charged"


# --- polling and downloading ---------------------------------------------------------------------


async def test_task_that_fails_at_kling_fails_with_klings_message(kling, kling_activities):
    kling.fail_with("Failure to pass the risk control system")
    acts = kling_activities()
    created, _ = await run_activity(acts.create, create_request())
    result, heartbeats = await run_activity(
        acts.poll, CloudPoll(job_id="job-1", task_id=created.task_id)
    )

    error = app_error(result, "KlingTaskFailed")
    assert error.non_retryable
    assert "risk control" in error.message and created.task_id in error.message
    assert "processing" in [h.phase for h in heartbeats]


async def test_poll_that_gets_no_usable_answer_is_retryable(kling, kling_activities):
    acts = kling_activities()
    created, _ = await run_activity(acts.create, create_request())
    kling.faults[f"/v1/videos/text2video/{created.task_id}"] = "http500"
    result, _ = await run_activity(acts.poll, CloudPoll(job_id="job-1", task_id=created.task_id))

    assert not app_error(result, "KlingUnavailable").non_retryable


async def test_poll_of_a_task_kling_does_not_know_gives_up_after_a_few_queries(
    kling, kling_activities
):
    result, _ = await run_activity(
        kling_activities().poll, CloudPoll(job_id="job-1", task_id="404404")
    )

    error = app_error(result, "KlingTaskUnknown")
    assert error.non_retryable and "404404" in error.message
    assert kling.query_hits == 2 * FAST.unknown_task_polls  # both kinds, each time


async def test_download_whose_url_expired_fails_clearly_and_is_not_retried(
    kling, kling_activities, tmp_path
):
    acts = kling_activities()
    req = create_request()
    created, _ = await run_activity(acts.create, req)
    done, _ = await run_activity(acts.poll, CloudPoll(job_id=req.job_id, task_id=created.task_id))
    kling.expire_videos()  # 30 days later
    result, _ = await run_activity(
        acts.download,
        CloudDownload(job_id=req.job_id, task_id=done.task_id, video_url=done.video_url),
    )

    error = app_error(result, "KlingVideoGone")
    assert error.non_retryable
    assert "HTTP 410" in error.message and "30 days" in error.message
    assert "Resubmit the job" in error.message
    assert not (tmp_path / "outputs" / req.job_id / f"kling-{done.task_id}.mp4").exists()


async def test_finished_download_is_kept_on_a_rerun(kling, kling_activities):
    acts = kling_activities()
    req = create_request()
    _, done, downloaded, _ = await run_route(acts, req)
    download = CloudDownload(job_id=req.job_id, task_id=done.task_id, video_url=done.video_url)

    again, _ = await run_activity(acts.download, download)

    assert isinstance(again, Downloaded) and again.outputs == downloaded.outputs
    assert kling.download_hits == 1


# --- money invariant 3 ---------------------------------------------------------------------------


async def test_keys_and_tokens_appear_in_no_error_log_heartbeat_or_result(
    kling, kling_activities, refused_url, caplog
):
    caplog.set_level(logging.DEBUG)
    seen: list[object] = []

    async def run(fn: Any, arg: Any) -> Any:
        result, heartbeats = await run_activity(fn, arg)
        seen.extend([result, heartbeats])
        if isinstance(result, ApplicationError):
            seen.append(result.details)
        return result

    acts = kling_activities(timing=dataclasses.replace(FAST, create_retry_budget_s=0.5))
    # Kling echoing the keys and a token back in its own words, on create and on query.
    echo = f"invalid Bearer {CANARY_ACCESS} {CANARY_SECRET} {sign_jwt(CANARY_ACCESS, 'x', 0)}"
    kling.answers["/v1/videos/text2video"] = {"code": 1201, "message": echo}
    await run(acts.create, create_request())
    del kling.answers["/v1/videos/text2video"]
    created = await run(acts.create, create_request())
    kling.answers[f"/v1/videos/text2video/{created.task_id}"] = {"code": 5000, "message": echo}
    await run(acts.poll, CloudPoll(job_id="job-1", task_id=created.task_id))
    kling.refuse_next_creates(1102, echo)
    await run(acts.create, create_request())
    await run(kling_activities(KLING_SECRET_KEY="kling-CANARY-wrong").create, create_request())
    offline = kling_activities(
        timing=dataclasses.replace(FAST, create_retry_budget_s=0.2), KLING_BASE_URL=refused_url
    )
    await run(offline.create, create_request())
    await run(offline.poll, CloudPoll(job_id="job-1", task_id="1"))
    missing = f"{kling.url}/sim-videos/nope.mp4"
    await run(acts.download, CloudDownload(job_id="job-2", task_id="1", video_url=missing))

    assert sum(isinstance(r, ApplicationError) for r in seen) == 7
    no_secrets(*seen, caplog.text)
