"""Completion callbacks against a real HTTP receiver on 127.0.0.1: the receiver verifies the
Standard Webhooks signature with the standardwebhooks library, every retry of one event carries
the same webhook-id and its own send time, a job's own URL gets no signature made with the
workers' secret, the job never waits for a slow or dead receiver, and the webhook URL (a
credential) appears in no error or log line."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import traceback
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from aiohttp import web
from pydantic import ValidationError
from standardwebhooks import Webhook, WebhookVerificationError
from temporalio.client import WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from activities import callbacks
from activities import callbacks as cb
from activities.callbacks import CallbackActivities, sign, standard_signature
from spillway.core import names
from spillway.core.errors import ConfigError
from spillway.core.models import Plan, VideoJob
from spillway.core.settings import load_settings
from spillway.temporal import installed_binary, register_search_attributes
from tests.support.callback_workflow import FireAndForget, JobThatCallsBack
from tests.support.cli import free_ports
from tests.support.graphs import VIDEO_GRAPH
from tests.support.jobs import Jobs, RunJobs
from tests.support.route_stubs import FREE, RouteStubs
from tests.support.settings import make_settings
from tests.support.waiting import until
from workflows.callback import CallbackWorkflow

# The spec's form: whsec_ and the base64 of random bytes.
SECRET = "whsec_" + base64.b64encode(b"spillway-test-key-4c1f-0123456789ab").decode()
RAW_SECRET = "spillway raw-text secret 4c1f"  # any other text: keyed as its UTF-8 bytes
SIGNATURE_HEADERS = ("webhook-signature", "X-Spillway-Signature")
# Shaped like a Slack incoming webhook: the path is the credential.
HOOK_PATH = "/services/T0SPILLWAY/B0CANARY/xyzzy9secret9path"
PLAN = {"route": "local", "state": "completed", "outputs": [{"uri": "s3://b/p/job/clip.mp4"}]}


def verifier(secret: str) -> Webhook:
    """How a receiver builds the library's verifier: a whsec_ secret as the text, a raw-text
    secret as its bytes (given text, the library base64-decodes it, whsec_ or not)."""
    return Webhook(secret if secret.startswith("whsec_") else secret.encode())


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at: float  # the receiver's clock when the request came in
    verified: bool | None  # None: no webhook-signature to verify


@dataclass
class Receiver:
    """A webhook receiver as a client would write one: it verifies webhook-signature with the
    standardwebhooks library and its own copy of the secret, and answers 401 when it fails."""

    url: str = ""  # known once it listens
    secret: str = SECRET
    answers: list[int] = field(default_factory=list)  # the first requests' statuses, then 204
    hold: asyncio.Event | None = None  # set: the receiver answers only once it is set
    pause_s: float = 0.0  # before every answer
    received: list[Received] = field(default_factory=list)
    answered: int = 0

    async def handle(self, request: web.Request) -> web.Response:
        at, raw, headers = time.time(), await request.read(), dict(request.headers)
        verified = None
        if "webhook-signature" in headers:
            try:
                verifier(self.secret).verify(raw, headers)
                verified = True
            except WebhookVerificationError:
                verified = False
        self.received.append(Received(headers, raw, at, verified))
        status = 401 if verified is False else self.answers.pop(0) if self.answers else 204
        if self.hold is not None:
            await self.hold.wait()
        await asyncio.sleep(self.pause_s)
        self.answered += 1
        return web.Response(status=status)


@pytest.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server of this module's own: the deliveries these tests leave retrying
    (by design they outlive their jobs) would otherwise hold the shared server's clock."""
    environment = await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter,
        test_server_existing_path=installed_binary("temporal-test-server"),
        port=free_ports(1)[0],
    )
    await register_search_attributes(environment.client)  # the jobs at the end set them
    yield environment
    await environment.shutdown()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    hook, app = Receiver(), web.Application()
    app.router.add_post(HOOK_PATH, hook.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    hook.url = f"http://127.0.0.1:{runner.addresses[0][1]}{HOOK_PATH}"
    yield hook
    if hook.hold is not None:
        hook.hold.set()
    await runner.cleanup()


def delivery(url: str | None, event: str = "job.completed") -> cb.CallbackDelivery:
    job_id = f"job-{uuid.uuid4().hex[:8]}"
    return cb.CallbackDelivery(
        url=url,
        delivery_id=f"{job_id}:{event}",
        event=cb.JobEvent.model_validate({"event": event, "job_id": job_id, "plan": PLAN}),
    )


def activities(
    http: httpx.AsyncClient, secret: str | None = SECRET, worker_url: str | None = None
) -> CallbackActivities:
    """The worker's side; both settings given, so a JOB_WEBHOOK_URL of the shell plays no part."""
    settings = make_settings(JOB_WEBHOOK_URL=worker_url, JOB_WEBHOOK_SECRET=secret)
    return CallbackActivities(http, settings)


def every_text(exc: BaseException) -> str:
    """An error as a log line, a traceback and each cause in Temporal's failure would show it."""
    texts = []
    while exc is not None:
        texts += [str(exc), repr(exc), *traceback.format_exception(exc)]
        exc = exc.__cause__  # type: ignore[assignment]
    return "\n".join(texts)


def logged(caplog: pytest.LogCaptureFixture) -> str:
    """What spillway's side logged. Not the receiver's own access log; nor httpx's INFO line
    (`HTTP Request: POST <url>`), which would print the URL: worker.py and the CLI set the
    `httpx` logger to WARNING, and so do these tests."""
    return "\n".join(r.getMessage() for r in caplog.records if r.name != "aiohttp.access")


def assert_no_url(text: str, url: str) -> None:
    assert url not in text
    assert "xyzzy9secret9path" not in text and "B0CANARY" not in text


# --- the request ---------------------------------------------------------------------------


def test_the_signature_is_the_specs_own_example():
    # The test vector of the Standard Webhooks specification.
    signature = standard_signature(
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        1614265330,
        b'{"test": 2432232314}',
        base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
    )
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_the_deprecated_signature_is_the_hmac_sha256_of_the_raw_body():
    # printf '{"a":1}' | openssl dgst -sha256 -hmac whsec-test
    assert sign(b'{"a":1}', "whsec-test") == (
        "sha256=a40e86f8db5b22c03b9272899c227b359d6580eb7969a4f90f643a3d90fdc1cc"
    )


@pytest.mark.parametrize("secret", [SECRET, RAW_SECRET], ids=["whsec", "raw-text"])
async def test_the_receiver_verifies_the_workers_delivery_with_standardwebhooks(
    receiver: Receiver, http: httpx.AsyncClient, secret: str
):
    receiver.secret = secret
    sent = delivery(None, "job.failed")
    acts = activities(http, secret=secret, worker_url=receiver.url)
    result = await ActivityEnvironment().run(acts.job_callback, sent)

    assert result == cb.CallbackResult(status_code=204, signed=True)
    [got] = receiver.received
    assert got.verified
    body = {"event": "job.failed", "job_id": sent.event.job_id, "plan": PLAN}
    assert verifier(secret).verify(got.body, got.headers) == body
    assert json.loads(got.body) == body
    assert got.headers["webhook-id"] == sent.delivery_id
    assert 0 <= got.at - int(got.headers["webhook-timestamp"]) < 2  # sent just now
    assert got.headers["Content-Type"] == "application/json"
    # The deprecated headers, as before.
    assert got.headers["X-Spillway-Event"] == "job.failed"
    assert got.headers["X-Spillway-Delivery"] == sent.delivery_id
    assert got.headers["X-Spillway-Signature"] == sign(got.body, secret)


async def test_a_tampered_body_timestamp_or_id_fails_verification(
    receiver: Receiver, http: httpx.AsyncClient
):
    acts = activities(http, worker_url=receiver.url)
    await ActivityEnvironment().run(acts.job_callback, delivery(None))
    [got] = receiver.received
    webhook = verifier(SECRET)
    webhook.verify(got.body, got.headers)
    later = str(int(got.headers["webhook-timestamp"]) + 1)
    tampered = [
        (got.body.replace(b"completed", b"cancelled"), got.headers),
        (got.body, got.headers | {"webhook-timestamp": later}),
        (got.body, got.headers | {"webhook-id": "job-other:job.completed"}),
    ]
    for body, headers in tampered:
        with pytest.raises(WebhookVerificationError, match="No matching signature"):
            webhook.verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        verifier(RAW_SECRET).verify(got.body, got.headers)


async def test_a_jobs_own_url_gets_no_signature_made_with_the_workers_secret(
    receiver: Receiver, http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
):
    # In this order: set_level also sets the capturing handler's level, which must end at INFO.
    caplog.set_level(logging.WARNING, logger="httpx")  # as worker.py sets it: see logged()
    caplog.set_level(logging.INFO)
    sent = delivery(receiver.url)
    result = await ActivityEnvironment().run(activities(http).job_callback, sent)

    assert result == cb.CallbackResult(status_code=204, signed=False)
    [got] = receiver.received
    assert not any(name in got.headers for name in SIGNATURE_HEADERS)
    assert got.headers["webhook-id"] == got.headers["X-Spillway-Delivery"] == sent.delivery_id
    assert 0 <= got.at - int(got.headers["webhook-timestamp"]) < 2
    assert "job's own URL: not signed with the workers' secret" in logged(caplog)
    assert_no_url(logged(caplog), receiver.url)


async def test_a_wrong_secret_is_refused_by_the_receiver_and_retryable(
    receiver: Receiver, http: httpx.AsyncClient
):
    acts = activities(http, secret="not-the-receivers-secret", worker_url=receiver.url)
    with pytest.raises(ApplicationError) as refused:
        await ActivityEnvironment().run(acts.job_callback, delivery(None))
    assert refused.value.type == cb.CALLBACK_REFUSED and not refused.value.non_retryable
    assert "HTTP 401" in str(refused.value)
    assert receiver.received[0].verified is False


async def test_the_jobs_own_url_wins_and_the_workers_url_is_the_default(
    receiver: Receiver, http: httpx.AsyncClient, refused_url: str
):
    own = activities(http, worker_url=refused_url)
    assert (await ActivityEnvironment().run(own.job_callback, delivery(receiver.url))).status_code
    default = activities(http, worker_url=receiver.url)
    assert (await ActivityEnvironment().run(default.job_callback, delivery(None))).status_code
    assert len(receiver.received) == 2


async def test_with_no_url_anywhere_nothing_is_sent(http: httpx.AsyncClient):
    result = await ActivityEnvironment().run(activities(http).job_callback, delivery(None))
    assert result == cb.CallbackResult(status_code=None, signed=False)


async def test_without_a_secret_the_callback_goes_out_unsigned_with_a_warning(
    receiver: Receiver, http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.WARNING, logger="httpx")
    acts = activities(http, secret=None, worker_url=receiver.url)
    result = await ActivityEnvironment().run(acts.job_callback, delivery(None))
    assert result == cb.CallbackResult(status_code=204, signed=False)
    assert not any(name in receiver.received[0].headers for name in SIGNATURE_HEADERS)
    assert "JOB_WEBHOOK_SECRET is not set" in logged(caplog)
    assert_no_url(logged(caplog), receiver.url)


# --- a dead receiver, and the URL as a credential ------------------------------------------


async def test_a_dead_receiver_fails_retryably_without_naming_the_url(
    receiver: Receiver,
    http: httpx.AsyncClient,
    refused_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    # In this order: set_level also sets the capturing handler's level, which must end at INFO.
    caplog.set_level(logging.WARNING, logger="httpx")  # as worker.py sets it: see logged()
    caplog.set_level(logging.INFO)
    monkeypatch.setattr(callbacks, "REQUEST_TIMEOUT_S", 0.5)
    acts = activities(http)
    receiver.hold = asyncio.Event()  # it never answers
    cases = [
        (refused_url + HOOK_PATH, cb.CALLBACK_UNREACHABLE, "ConnectError"),
        (receiver.url, cb.CALLBACK_UNREACHABLE, "Timeout"),
    ]
    for url, kind, says in cases:
        started = time.monotonic()
        with pytest.raises(ApplicationError) as failed:
            await ActivityEnvironment().run(acts.job_callback, delivery(url))
        assert time.monotonic() - started < 5
        assert failed.value.type == kind and not failed.value.non_retryable
        assert says in str(failed.value)
        assert_no_url(every_text(failed.value), url)
    receiver.hold.set()
    receiver.answers = [503]
    with pytest.raises(ApplicationError, match="answered HTTP 503") as refused:
        await ActivityEnvironment().run(acts.job_callback, delivery(receiver.url))
    assert_no_url(every_text(refused.value), receiver.url)
    assert_no_url(logged(caplog), receiver.url)


async def test_a_url_no_retry_can_fix_fails_at_once_without_naming_it(http: httpx.AsyncClient):
    url = "http://[::1" + HOOK_PATH  # unbalanced bracket: not a URL
    with pytest.raises(ApplicationError) as bad:
        await ActivityEnvironment().run(activities(http).job_callback, delivery(url))
    assert bad.value.type == cb.CALLBACK_BAD_URL and bad.value.non_retryable
    assert_no_url(every_text(bad.value), url)


def test_the_url_stays_out_of_reprs_validation_errors_and_settings_errors(
    monkeypatch: pytest.MonkeyPatch,
):
    url = "https://hooks.example.com" + HOOK_PATH
    assert_no_url(repr(delivery(url)), url)
    with pytest.raises(ValidationError) as invalid:
        cb.CallbackDelivery.model_validate(
            {"url": "ftp://hooks.example.com" + HOOK_PATH, "delivery_id": "d", "event": {}}
        )
    assert_no_url(str(invalid.value), url)
    monkeypatch.setenv("JOB_WEBHOOK_URL", "hooks.example.com" + HOOK_PATH)
    with pytest.raises(ConfigError, match=r"JOB_WEBHOOK_URL: .*must start with http") as bad:
        load_settings()
    assert_no_url(str(bad.value), url)
    monkeypatch.setenv("JOB_WEBHOOK_URL", url)
    assert_no_url(repr(load_settings()), url)


# --- through Temporal ----------------------------------------------------------------------


def worker(env: WorkflowEnvironment, acts: CallbackActivities, task_queue: str) -> Worker:
    return Worker(
        env.client,
        task_queue=task_queue,
        workflows=[CallbackWorkflow, JobThatCallsBack, FireAndForget],
        activities=[acts.job_callback],
    )


async def test_a_retry_repeats_the_webhook_id_with_its_own_send_time_and_signature(
    env: WorkflowEnvironment, receiver: Receiver, http: httpx.AsyncClient
):
    receiver.answers = [500, 200]
    receiver.pause_s = 1.1  # the retry is sent at least a second after the first attempt
    sent, task_queue = delivery(None), f"callback-{uuid.uuid4()}"
    async with worker(env, activities(http, worker_url=receiver.url), task_queue):
        result = await env.client.execute_workflow(
            CallbackWorkflow.run, sent, id=f"callback-{uuid.uuid4()}", task_queue=task_queue
        )
    assert result == cb.CallbackResult(status_code=200, signed=True)
    first, retry = receiver.received
    assert first.headers["webhook-id"] == retry.headers["webhook-id"] == sent.delivery_id
    assert first.body == retry.body
    stamps = [int(r.headers["webhook-timestamp"]) for r in (first, retry)]
    assert stamps[1] > stamps[0]
    assert all(0 <= r.at - stamp < 2 for r, stamp in zip((first, retry), stamps, strict=True))
    assert first.verified and retry.verified  # each signed over its own timestamp


async def test_a_receiver_failing_twice_gets_the_same_delivery_id_three_times(
    env: WorkflowEnvironment, receiver: Receiver, http: httpx.AsyncClient
):
    receiver.answers = [500, 500]
    sent, task_queue = delivery(None), f"callback-{uuid.uuid4()}"
    async with worker(env, activities(http, worker_url=receiver.url), task_queue):
        result = await env.client.execute_workflow(
            CallbackWorkflow.run, sent, id=f"callback-{uuid.uuid4()}", task_queue=task_queue
        )
    assert result == cb.CallbackResult(status_code=204, signed=True)
    assert [r.headers["webhook-id"] for r in receiver.received] == [sent.delivery_id] * 3
    assert all(r.verified for r in receiver.received)


async def test_a_receiver_that_stays_down_fails_the_delivery_without_naming_the_url(
    env: WorkflowEnvironment, http: httpx.AsyncClient, refused_url: str
):
    if not env.supports_time_skipping:
        pytest.skip("CALLBACK_RETRY gives up after about an hour: a time-skipping server only")
    url, task_queue = refused_url + HOOK_PATH, f"callback-{uuid.uuid4()}"
    async with worker(env, activities(http), task_queue):
        with pytest.raises(WorkflowFailureError) as failed:
            await env.client.execute_workflow(
                CallbackWorkflow.run,
                delivery(url),
                id=f"callback-{uuid.uuid4()}",
                task_queue=task_queue,
            )
    text = every_text(failed.value)
    assert "ConnectError" in text
    assert_no_url(text, url)


async def test_the_job_returns_at_once_and_its_callback_arrives_later(
    env: WorkflowEnvironment, receiver: Receiver, http: httpx.AsyncClient
):
    receiver.hold = asyncio.Event()  # the receiver is slow: it answers only when released
    receiver.answers = [500]  # and then fails once
    sent, task_queue = delivery(receiver.url), f"callback-{uuid.uuid4()}"
    job_id = sent.event.job_id
    async with worker(env, activities(http), task_queue):
        outcome = await env.client.execute_workflow(
            JobThatCallsBack.run, sent, id=job_id, task_queue=task_queue
        )
        assert outcome == "completed"
        assert receiver.answered == 0  # the job did not wait for the receiver
        receiver.hold.set()
        for _ in range(60):  # the retry after the 500 waits CALLBACK_RETRY's first interval
            if len(receiver.received) == 2:
                break
            await env.sleep(1)  # skipped time on the time-skipping server
        child = env.client.get_workflow_handle(
            f"{job_id}-callback-job.completed", result_type=cb.CallbackResult
        )
        delivered = await child.result()
    assert delivered.status_code == 204
    assert [r.headers["webhook-id"] for r in receiver.received] == [sent.delivery_id] * 2


async def test_an_activity_started_without_await_is_lost_when_the_workflow_ends(
    env: WorkflowEnvironment, receiver: Receiver, http: httpx.AsyncClient
):
    # Why JobThatCallsBack uses a child workflow: this shortcut never reaches the receiver.
    task_queue = f"callback-{uuid.uuid4()}"
    async with worker(env, activities(http), task_queue):
        outcome = await env.client.execute_workflow(
            FireAndForget.run,
            delivery(receiver.url),
            id=f"callback-{uuid.uuid4()}",
            task_queue=task_queue,
        )
        await asyncio.sleep(1.5)
    assert outcome == "completed"
    assert receiver.received == []


# --- from the end of a real job ------------------------------------------------------------


async def start_with_callback(jobs: Jobs, url: str | None) -> Any:
    job_id = f"cb-{uuid.uuid4().hex[:10]}"
    job = VideoJob(job_id=job_id, graph=VIDEO_GRAPH, callback_url=url)
    return await jobs.client.start_workflow(
        "VideoJobWorkflow", job, id=job_id, task_queue=jobs.task_queue, result_type=Plan
    )


async def test_a_completed_job_posts_its_event_unsigned_to_its_own_callback_url(
    run_jobs: RunJobs, receiver: Receiver
):
    async with run_jobs(RouteStubs(FREE), JOB_WEBHOOK_SECRET=SECRET) as jobs:
        handle = await start_with_callback(jobs, receiver.url)
        plan = await handle.result()
        await until(lambda: receiver.received, what="the callback")
    [got] = receiver.received
    body = json.loads(got.body)
    assert (body["event"], body["job_id"]) == ("job.completed", plan.job_id)
    assert body["plan"]["state"] == "completed" and body["plan"]["route"] == "local"
    assert not any(name in got.headers for name in SIGNATURE_HEADERS)
    assert got.headers["webhook-id"] == f"{plan.job_id}:{handle.result_run_id}:job.completed"


async def test_a_failed_job_posts_job_failed_to_the_workers_webhook(
    run_jobs: RunJobs, receiver: Receiver
):
    stubs = RouteStubs(FREE)
    stubs.fail[names.COMFYUI_SUBMIT] = ApplicationError("graph rejected", non_retryable=True)
    settings = {"JOB_WEBHOOK_URL": receiver.url, "JOB_WEBHOOK_SECRET": SECRET}
    async with run_jobs(stubs, **settings) as jobs:
        handle = await start_with_callback(jobs, None)
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        await until(lambda: receiver.received, what="the callback")
    [got] = receiver.received
    assert got.verified
    body = json.loads(got.body)
    assert (body["event"], body["plan"]["state"]) == ("job.failed", "failed")
    assert "graph rejected" in body["plan"]["error"]


async def test_a_dead_receiver_never_delays_or_fails_the_job(run_jobs: RunJobs, refused_url):
    async with run_jobs(RouteStubs(FREE)) as jobs:
        handle = await start_with_callback(jobs, refused_url + HOOK_PATH)
        plan = await asyncio.wait_for(handle.result(), 10)  # not held by the receiver
    assert plan.state == "completed"
