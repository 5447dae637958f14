"""The MiniMax double answers like MiniMax's API reference (docs/design.md, "MiniMax facts") and its
knobs do what the activity tests rely on."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import httpx
import pytest

from spillway.sim.minimax import MiniMaxSim
from tests.support.constants import CANARY_KEY
from tests.support.minimax import VIDEO_SIZE
from tests.support.waiting import until

AUTH = {"Authorization": f"Bearer {CANARY_KEY}"}
BODY = {
    "model": "MiniMax-Hailuo-2.3",
    "prompt": "a heron over a spillway at dawn",
    "duration": 6,
    "resolution": "768P",
    "prompt_optimizer": True,
}


def ok(response: httpx.Response) -> dict[str, Any]:
    """The JSON of an answer MiniMax gave with HTTP 200 (its errors too come as 200)."""
    assert response.status_code == 200
    answer: dict[str, Any] = response.json()
    return answer


async def create(http: httpx.AsyncClient, sim: MiniMaxSim, **changes: Any) -> dict[str, Any]:
    return ok(await http.post(f"{sim.url}/v1/video_generation", json=BODY | changes, headers=AUTH))


async def query(http: httpx.AsyncClient, sim: MiniMaxSim, task_id: str) -> dict[str, Any]:
    url = f"{sim.url}/v1/query/video_generation"
    return ok(await http.get(url, params={"task_id": task_id}, headers=AUTH))


async def retrieve(http: httpx.AsyncClient, sim: MiniMaxSim, file_id: str) -> dict[str, Any]:
    url = f"{sim.url}/v1/files/retrieve"
    return ok(await http.get(url, params={"file_id": file_id}, headers=AUTH))


async def test_task_walks_to_success_and_its_file_downloads_without_the_key(http, minimax):
    created = await create(http, minimax)
    assert created["base_resp"] == {"status_code": 0, "status_msg": "success"}
    task_id = created["task_id"]
    assert isinstance(task_id, str) and task_id.isdigit()

    answers = [await query(http, minimax, task_id) for _ in range(5)]
    assert [a["status"] for a in answers] == [
        "Preparing",
        "Queueing",
        "Processing",
        "Success",
        "Success",
    ]
    done = answers[3]
    assert isinstance(done["file_id"], str)  # a string here ...
    assert (done["video_width"], done["video_height"]) == (1366, 768)
    assert "file_id" not in answers[0]

    file = (await retrieve(http, minimax, done["file_id"]))["file"]
    assert isinstance(file["file_id"], int) and str(file["file_id"]) == done["file_id"]  # ... int
    assert file["bytes"] == VIDEO_SIZE and file["filename"] == "output.mp4"
    video = await http.get(file["download_url"])  # pre-signed: no Authorization header
    assert video.status_code == 200
    assert hashlib.sha256(video.content).hexdigest() == minimax.sha256_of_task(task_id)
    assert video.content[4:8] == b"ftyp"
    assert (minimax.create_calls, minimax.tasks_created, minimax.query_hits) == (1, 1, 5)
    assert (minimax.retrieve_hits, minimax.download_hits, minimax.download_auth_headers) == (
        1,
        1,
        0,
    )
    assert minimax.create_bodies == [BODY]


async def test_missing_key_answers_1004_and_wrong_key_2049_with_http_200(http, minimax):
    url = f"{minimax.url}/v1/video_generation"
    missing = await http.post(url, json=BODY)
    wrong = await http.post(url, json=BODY, headers={"Authorization": "Bearer sk-not-this-one"})
    query_wrong = await http.get(
        f"{minimax.url}/v1/query/video_generation",
        params={"task_id": "1"},
        headers={"Authorization": "Bearer nope"},
    )

    assert missing.status_code == wrong.status_code == 200
    assert missing.json()["base_resp"]["status_code"] == 1004
    assert "Authorization" in missing.json()["base_resp"]["status_msg"]
    assert wrong.json()["base_resp"] == {"status_code": 2049, "status_msg": "invalid api key"}
    assert query_wrong.json()["base_resp"]["status_code"] == 2049
    assert minimax.create_calls == 2 and minimax.tasks_created == 0
    assert [r.auth for r in minimax.requests] == ["missing", "wrong", "wrong"]
    assert CANARY_KEY not in repr(minimax.requests) + repr(vars(minimax))


async def test_injected_codes_answer_once_per_injection_on_each_endpoint(http, minimax):
    minimax.inject("create", 1002)
    minimax.inject("query", 1002, times=2)
    minimax.inject("retrieve", 1033, "system busy")

    refused = await create(http, minimax)
    assert refused == {
        "task_id": "",
        "base_resp": {"status_code": 1002, "status_msg": "rate limit"},
    }
    task_id = (await create(http, minimax))["task_id"]
    assert [
        (await query(http, minimax, task_id))["base_resp"]["status_code"] for _ in range(3)
    ] == [
        1002,
        1002,
        0,
    ]
    minimax.set_statuses(["Success"])
    file_id = (await query(http, minimax, (await create(http, minimax))["task_id"]))["file_id"]
    assert (await retrieve(http, minimax, file_id))["base_resp"]["status_msg"] == "system busy"
    assert (await retrieve(http, minimax, file_id))["base_resp"]["status_code"] == 0
    assert minimax.create_calls == 3 and minimax.tasks_created == 2


async def test_parameters_minimax_does_not_accept_answer_2013(http, minimax):
    answer = await create(http, minimax, model="Hailuo-Imaginary")
    assert answer["base_resp"]["status_code"] == 2013
    answer = await create(http, minimax, resolution="1080P", duration=10)
    assert answer["base_resp"]["status_code"] == 2013
    assert minimax.tasks_created == 0


async def test_fail_mode_ends_tasks_in_fail_with_its_message(http, minimax):
    minimax.fail_with("video generation failed: output new_sensitive", status_code=1027)
    task_id = (await create(http, minimax))["task_id"]
    statuses = [await query(http, minimax, task_id) for _ in range(3)]
    assert [s["status"] for s in statuses] == ["Preparing", "Processing", "Fail"]
    assert statuses[-1]["base_resp"] == {
        "status_code": 1027,
        "status_msg": "video generation failed: output new_sensitive",
    }


async def test_status_sequence_can_be_set_per_prompt_and_counters_count_per_prompt(http, minimax):
    minimax.set_statuses(["Queueing", "Success"], prompt="quick")
    quick = (await create(http, minimax, prompt="quick"))["task_id"]
    slow = (await create(http, minimax))["task_id"]
    await create(http, minimax, prompt="quick")
    assert (await query(http, minimax, quick))["status"] == "Queueing"
    assert (await query(http, minimax, quick))["status"] == "Success"
    assert (await query(http, minimax, slow))["status"] == "Preparing"
    assert minimax.create_calls_by_prompt == {"quick": 2, BODY["prompt"]: 1}
    assert minimax.tasks_by_prompt == {"quick": 2, BODY["prompt"]: 1}


@pytest.mark.parametrize("creates_task", [True, False])
async def test_hang_after_create_reads_it_counts_it_and_never_answers_until_released(
    http, minimax, creates_task
):
    minimax.fault_next_create("hang", creates_task=creates_task)
    pending = asyncio.create_task(create(http, minimax))
    await until(lambda: minimax.create_bodies)
    await asyncio.sleep(0.1)
    assert not pending.done()
    assert minimax.create_bodies == [BODY]
    assert (minimax.create_calls, minimax.tasks_created) == (1, int(creates_task))

    minimax.release()
    with pytest.raises(httpx.RemoteProtocolError):
        await pending
    assert (await create(http, minimax))["base_resp"]["status_code"] == 0  # one-shot


async def test_drop_after_create_closes_the_connection_with_the_task_made(http, minimax):
    minimax.fault_next_create("drop")
    with pytest.raises(httpx.RemoteProtocolError):
        await create(http, minimax)
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)
    assert minimax.create_bodies == [BODY]


async def test_expired_download_url_stays_expired_and_a_new_retrieve_gives_a_working_one(
    http, minimax
):
    minimax.set_statuses(["Success"])
    task_id = (await create(http, minimax))["task_id"]
    file_id = (await query(http, minimax, task_id))["file_id"]
    minimax.expire_next_urls(1, status=410)

    stale = (await retrieve(http, minimax, file_id))["file"]["download_url"]
    assert (await http.get(stale)).status_code == 410
    assert (await http.get(stale)).status_code == 410
    fresh = (await retrieve(http, minimax, file_id))["file"]["download_url"]
    assert fresh != stale
    assert (await http.get(fresh)).status_code == 200


async def test_video_bytes_are_deterministic_per_file(minimax):
    other = MiniMaxSim(video_size=VIDEO_SIZE)
    assert minimax.video_bytes(7) == other.video_bytes(7) != minimax.video_bytes(8)
    assert len(minimax.video_bytes(7)) == VIDEO_SIZE


async def test_stopped_double_refuses_connections_and_keeps_its_tasks(http, minimax):
    task_id = (await create(http, minimax))["task_id"]
    await minimax.stop()
    with pytest.raises(httpx.ConnectError):
        await create(http, minimax)
    await minimax.start()
    assert (await query(http, minimax, task_id))["status"] == "Preparing"


async def test_a_restarted_double_never_hands_out_an_earlier_task_id(http):
    """`spillway dev` restarted starts its doubles again over the jobs it kept: a task id given
    before would name an earlier job's task."""
    handed_out: list[str] = []
    for _ in range(2):
        async with MiniMaxSim(api_key=CANARY_KEY, video_size=VIDEO_SIZE) as sim:
            handed_out += [(await create(http, sim))["task_id"] for _ in range(2)]
    assert len(set(handed_out)) == 4, handed_out
    assert all(task_id.isdigit() for task_id in handed_out)
