"""The Kling client against the Kling double over real loopback HTTP: videos arrive intact, every
refusal reads as what it proves, an ambiguous create is reconciled to exactly one task, and no
key reaches an error message or the video host."""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from activities.cloud.models import CreateVerdict
from activities.kling.answers import KlingTask
from activities.kling.client import KlingClient, KlingError, KlingTiming
from activities.kling.requests import Kind, create_body, sign_jwt
from spillway.core.settings import Settings
from spillway.sim.kling import KlingSim
from tests.support.kling import CANARY_ACCESS, CANARY_SECRET

PROMPT = "a heron lifting off over a spillway at dawn"
PNG = (  # Kling's own example of a bare base64 image
    "iVBORw0KGgoAAAANSUhEUgAAAAUAAAAFCAYAAACNbyblAAAAHElEQVQI12P4//8/w38GIAXDIBKE0DHxgljNBAAO9TXL0Y4OHwAAAABJRU5ErkJggg=="
)
FAST = KlingTiming(connect_timeout_s=1.0, create_timeout_s=0.5, request_timeout_s=2.0)


@pytest.fixture
def client(http: httpx.AsyncClient, kling: KlingSim) -> KlingClient:
    return KlingClient(http, kling.url, CANARY_ACCESS, CANARY_SECRET, FAST)


def body(kind: Kind = "text2video", external_task_id: str | None = None) -> dict[str, Any]:
    external = external_task_id or f"job-{uuid.uuid4().hex[:12]}"
    if kind == "image2video":
        return create_body(kind, external_task_id=external, prompt=PROMPT, image=PNG)
    return create_body(kind, external_task_id=external, prompt=PROMPT)


def created(verdict: CreateVerdict) -> str:
    assert verdict.outcome == "created", verdict
    assert verdict.task_id
    return verdict.task_id


def no_canary(*texts: object) -> None:
    for text in texts:
        assert "CANARY" not in str(text), text
        assert "eyJ" not in str(text), text  # no JWT either: it names the access key


async def sha256_of(client: KlingClient, url: str) -> str:
    digest = hashlib.sha256()
    async with client.stream_video(url) as response:
        async for chunk in response.aiter_bytes():
            digest.update(chunk)
    return digest.hexdigest()


@pytest.mark.parametrize("kind", ["text2video", "image2video"])
async def test_create_poll_and_stream_delivers_the_videos_exact_bytes(client, kling, kind):
    verdict = await client.create(kind, body(kind))
    task_id = created(verdict)
    assert verdict.attempts == 1 and verdict.sent_at is not None

    statuses = [(await client.query(kind, task_id)).status for _ in range(4)]
    assert statuses == ["submitted", "processing", "succeed", "succeed"]
    done = await client.query(kind, task_id)
    assert len(done.video_urls) == 1

    assert await sha256_of(client, done.video_urls[0]) == kling.sha256_of_task(task_id)
    assert (kling.create_calls, kling.tasks_created, kling.query_hits) == (1, 1, 5)
    assert kling.download_hits == 1
    assert kling.auth_headers["download"] == [""]  # the video URL got no Authorization
    assert all(h.startswith("Bearer eyJ") for h in kling.auth_headers["create"])
    if kind == "image2video":
        assert kling.create_bodies[0]["image"] == PNG


async def test_used_up_resource_pack_is_refused_and_makes_no_task(client, kling):
    kling.refuse_next_creates(1102)

    verdict = await client.create("text2video", body())

    assert (verdict.outcome, verdict.code, verdict.rate_limited) == ("refused", 1102, False)
    assert "resource pack" in verdict.message
    assert (kling.create_calls, kling.tasks_created) == (1, 0)


async def test_parallel_task_limit_asks_to_retry_later_and_the_retry_makes_one_task(client, kling):
    kling.refuse_next_creates(1303)
    request = body()

    first = await client.create("text2video", request)
    assert (first.outcome, first.code, first.rate_limited) == ("retry", 1303, True)
    created(await client.create("text2video", request))
    assert (kling.create_calls, kling.tasks_created) == (2, 1)


@pytest.mark.parametrize("fault", ["hang", "drop"])
async def test_create_lost_after_the_task_was_made_is_ambiguous_and_reconcile_finds_that_task(
    client, kling, fault
):
    kling.fault_next_create(fault, creates_task=True)
    request = body()

    verdict = await client.create("text2video", request)
    assert verdict.outcome == "ambiguous" and verdict.task_id is None, verdict

    reconciled = await client.reconcile("text2video", request["external_task_id"])
    task_id = created(reconciled)
    assert kling.task_by_external_id(request["external_task_id"]).task_id == task_id
    assert (kling.create_calls, kling.tasks_created) == (1, 1)
    # The reconcile was the task's first query: this second one finds it one step further.
    assert (await client.query("text2video", task_id)).status == "processing"


async def test_create_lost_before_any_task_was_made_reconciles_to_send_it_again(client, kling):
    kling.fault_next_create("drop", creates_task=False)
    request = body()

    assert (await client.create("text2video", request)).outcome == "ambiguous"
    reconciled = await client.reconcile("text2video", request["external_task_id"])
    # Not "refused": the lost create might still become a task, so the job stays with Kling.
    assert reconciled.outcome == "retry", reconciled
    created(await client.create("text2video", request))
    assert (kling.create_calls, kling.tasks_created) == (2, 1)


async def test_repeated_create_with_the_same_external_id_never_makes_a_second_task(client, kling):
    request = body()
    task_id = created(await client.create("text2video", request))

    again = await client.create("text2video", request)
    assert again.outcome == "ambiguous" and again.code == 1201, again
    assert created(await client.reconcile("text2video", request["external_task_id"])) == task_id
    # Not even through the other endpoint: external_task_id is unique per account.
    image = body("image2video", request["external_task_id"])
    assert (await client.create("image2video", image)).outcome == "ambiguous"
    assert (kling.create_calls, kling.tasks_created) == (3, 1)


async def test_create_without_an_external_id_is_never_sent(client, kling):
    request = body()
    del request["external_task_id"]

    with pytest.raises(ValueError, match="external_task_id"):
        await client.create("text2video", request)
    assert kling.create_calls == 0


async def test_reconcile_that_cannot_reach_kling_stays_ambiguous(http, refused_url):
    client = KlingClient(http, refused_url, CANARY_ACCESS, CANARY_SECRET, FAST)

    verdict = await client.reconcile("text2video", "job-unreachable")

    assert verdict.outcome == "ambiguous"
    no_canary(verdict)


async def test_expired_token_is_signed_anew_and_the_create_goes_through(http, kling):
    stale = [time.time() - 4000]  # the first token is signed by a clock 66 min behind

    def clock() -> float:
        return stale.pop() if stale else time.time()

    client = KlingClient(http, kling.url, CANARY_ACCESS, CANARY_SECRET, FAST, clock=clock)
    verdict = await client.create("text2video", body())
    task_id = created(verdict)

    assert verdict.attempts == 2 and verdict.sent_at is not None
    assert (kling.create_calls, kling.tasks_created) == (2, 1)
    stale.append(time.time() - 4000)
    assert (await client.query("text2video", task_id)).task_id == task_id
    assert kling.query_hits == 2


async def test_a_clock_that_stays_wrong_gets_the_expiry_back_after_one_fresh_try(http, kling):
    client = KlingClient(
        http, kling.url, CANARY_ACCESS, CANARY_SECRET, FAST, clock=lambda: time.time() - 4000
    )

    verdict = await client.create("text2video", body())

    assert (verdict.outcome, verdict.code) == ("retry", 1004)
    assert (kling.create_calls, kling.tasks_created) == (2, 0)


async def test_wrong_secret_is_refused_and_the_message_shows_no_key(http, kling):
    client = KlingClient(http, kling.url, CANARY_ACCESS, "kling-CANARY-wrong-secret", FAST)

    verdict = await client.create("text2video", body())

    assert (verdict.outcome, verdict.code) == ("refused", 1002)
    assert kling.tasks_created == 0
    no_canary(verdict)


async def test_connection_refused_before_sending_asks_to_retry(http, refused_url):
    client = KlingClient(http, refused_url, CANARY_ACCESS, CANARY_SECRET, FAST)

    verdict = await client.create("text2video", body())

    assert verdict.outcome == "retry" and not verdict.rate_limited
    assert "could not connect" in verdict.message


@pytest.mark.parametrize("fault", ["http500", "garbage", "html"])
async def test_server_error_or_an_answer_that_is_not_klings_is_ambiguous(client, kling, fault):
    kling.faults["/v1/videos/text2video"] = fault

    assert (await client.create("text2video", body())).outcome == "ambiguous"
    assert kling.tasks_created == 0


async def test_failed_task_reports_klings_reason(client, kling):
    kling.fail_with("Failure to pass the risk control system")
    task_id = created(await client.create("text2video", body()))

    tasks = [await client.query("text2video", task_id) for _ in range(3)]

    assert [t.status for t in tasks] == ["submitted", "processing", "failed"]
    assert tasks[-1].message == "Failure to pass the risk control system"
    assert tasks[-1].video_urls == []


async def test_unknown_task_is_an_error_by_task_id_and_none_by_external_id(client, kling):
    with pytest.raises(KlingError) as raised:
        await client.query("text2video", "123")
    assert (raised.value.code, raised.value.retryable) == (1203, False)
    assert await client.query_external("text2video", "job-never-sent") is None
    # A task is found only under its own kind, by either id.
    request = body("image2video")
    task_id = created(await client.create("image2video", request))
    found = await client.query_external("image2video", request["external_task_id"])
    assert isinstance(found, KlingTask) and found.task_id == task_id
    assert await client.query_external("text2video", request["external_task_id"]) is None


async def test_no_key_or_token_appears_in_any_error_text(client, kling, http, refused_url):
    token = sign_jwt(CANARY_ACCESS, CANARY_SECRET, int(time.time()))
    echo = f"invalid Authorization Bearer {token} for {CANARY_ACCESS} with {CANARY_SECRET}"
    kling.answers["/v1/videos/text2video"] = {"code": 1201, "message": echo}
    kling.answers["/v1/videos/text2video/t-echo"] = {"code": 5000, "message": echo}
    texts: list[object] = [await client.create("text2video", body())]
    with pytest.raises(KlingError) as raised:
        await client.query("text2video", "t-echo")
    texts.append(raised.value)
    texts.append(await client.reconcile("text2video", "t-echo"))
    with pytest.raises(KlingError) as raised:
        async with client.stream_video(f"{kling.url}/sim-videos/nope.mp4?token={CANARY_SECRET}"):
            pass
    texts.append(raised.value)
    offline = KlingClient(http, refused_url, CANARY_ACCESS, CANARY_SECRET, FAST)
    texts.append(await offline.create("text2video", body()))
    with pytest.raises(KlingError) as raised:
        await offline.query("text2video", "t-1")
    texts.append(raised.value)

    no_canary(*texts, *(repr(t) for t in texts))


async def test_video_download_carries_no_authorization_even_from_a_client_with_one(kling):
    async with httpx.AsyncClient(headers={"Authorization": "Bearer shared-default"}) as http:
        client = KlingClient(http, kling.url, CANARY_ACCESS, CANARY_SECRET, FAST)
        task_id = created(await client.create("text2video", body()))
        for _ in range(3):
            task = await client.query("text2video", task_id)
        assert await sha256_of(client, task.video_urls[0]) == kling.sha256_of_task(task_id)

    assert kling.auth_headers["download"] == [""]
    assert all(h.startswith("Bearer eyJ") for h in kling.auth_headers["query"])


# --- the double itself answers like Kling's reference ----------------------------------------


async def post_raw(http: httpx.AsyncClient, kling: KlingSim, auth: str | None) -> httpx.Response:
    headers = {} if auth is None else {"Authorization": auth}
    return await http.post(f"{kling.url}/v1/videos/text2video", json=body(), headers=headers)


def bearer(access: str, secret: str, skew_s: int) -> Callable[[], str]:
    """A token signed when the test runs (a token signed at collection would age during the run)."""
    return lambda: f"Bearer {sign_jwt(access, secret, int(time.time()) + skew_s)}"


def fixed(auth: str | None) -> Callable[[], str | None]:
    return lambda: auth


@pytest.mark.parametrize(
    ("auth", "code"),
    [
        (fixed(None), 1001),
        (fixed("Basic abc"), 1002),
        (fixed("Bearer not-a-jwt"), 1002),
        (bearer(CANARY_ACCESS, "another-secret", 0), 1002),
        (bearer("another-access-key", CANARY_SECRET, 0), 1002),
        (bearer(CANARY_ACCESS, CANARY_SECRET, 600), 1003),
        (bearer(CANARY_ACCESS, CANARY_SECRET, -1900), 1004),
    ],
    ids=["no header", "not bearer", "not a jwt", "wrong secret", "wrong issuer", "nbf", "exp"],
)
async def test_double_refuses_bad_tokens_with_http_401_and_klings_code(http, kling, auth, code):
    response = await post_raw(http, kling, auth())

    assert response.status_code == 401
    assert response.json()["code"] == code and response.json()["data"] is None
    assert (kling.create_calls, kling.tasks_created) == (1, 0)
    assert CANARY_SECRET not in repr(vars(kling))  # the double keeps its keys out of sight


async def test_double_answers_refusals_and_duplicates_with_their_http_status(http, kling):
    token = f"Bearer {sign_jwt(CANARY_ACCESS, CANARY_SECRET, int(time.time()))}"
    kling.refuse_next_creates(1102)
    kling.refuse_next_creates(1303)
    request = body()
    url = f"{kling.url}/v1/videos/text2video"

    answers = [await http.post(url, json=request, headers={"Authorization": token}) for _ in "123"]
    duplicate = await http.post(url, json=request, headers={"Authorization": token})

    assert [(a.status_code, a.json()["code"]) for a in answers] == [
        (429, 1102),
        (429, 1303),
        (200, 0),
    ]
    made = answers[2].json()["data"]
    assert made["task_status"] == "submitted"
    assert made["task_info"] == {"external_task_id": request["external_task_id"]}
    assert (duplicate.status_code, duplicate.json()["code"]) == (400, 1201)
    number = await http.post(url, json=body() | {"duration": 5}, headers={"Authorization": token})
    assert (number.status_code, number.json()["code"]) == (400, 1201)
    assert kling.tasks_created == 1


def test_longest_create_ends_within_the_default_shutdown_grace():
    # A create once sent is never abandoned: a worker's shutdown grace must outlast it.
    grace = Settings.model_fields["SPILLWAY_SHUTDOWN_GRACE_S"].default
    assert KlingTiming().longest_create_s() < grace


async def test_a_restarted_double_never_hands_out_an_earlier_task_id(http):
    """`spillway dev` restarted starts its doubles again over the jobs it kept: a task id given
    before would name an earlier job's task."""
    handed_out: list[str] = []
    for _ in range(2):
        async with KlingSim(access_key=CANARY_ACCESS, secret_key=CANARY_SECRET) as sim:
            client = KlingClient(http, sim.url, CANARY_ACCESS, CANARY_SECRET, FAST)
            handed_out += [created(await client.create("text2video", body())) for _ in range(2)]
    assert len(set(handed_out)) == 4, handed_out
