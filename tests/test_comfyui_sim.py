"""The ComfyUI double answers like the real ComfyUI 0.3.64 recorded in tests/comfyui_transcripts
(a copy of shared/comfyui-transcripts): the recorded requests are replayed against it and its
answers compared with the recorded ones (status, content type, body; WebSocket messages in
order)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from spillway.sim.comfyui import ComfyUISim, PromptState
from spillway.sim.comfyui_graph import Host
from tests.support.graphs import GRAIN_GRAPH

TRANSCRIPTS = Path(__file__).resolve().parent / "comfyui_transcripts"
CLIENT = "capture-553293"


def transcript(name: str) -> Any:
    return json.loads((TRANSCRIPTS / name).read_text())


def answer_in(exchange: dict[str, Any]) -> tuple[int, Any, Any]:
    """A recorded exchange's answer as `post` and `get` return theirs: status, type, body."""
    return exchange["status"], exchange["content_type"], exchange["body"]


def recorded_answer(name: str) -> tuple[int, Any, Any]:
    return answer_in(transcript(name))


def normalised(value: Any) -> Any:
    """Timestamps and ComfyUI's file counters differ from run to run; nothing else may."""
    text = json.dumps(value)
    text = re.sub(r'"timestamp": \d+', '"timestamp": 0', text)
    text = re.sub(r"_\d{5}_\.", "_N_.", text)
    return json.loads(text)


def queued_request(item: list[Any]) -> dict[str, Any]:
    """The POST /prompt body that put a recorded queue/history item there."""
    return {"prompt": item[2], "client_id": item[3]["client_id"], "prompt_id": item[1]}


def recorded_history(name: str) -> tuple[str, dict[str, Any]]:
    [(prompt_id, entry)] = transcript(name)["body"].items()
    return prompt_id, entry


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def answer_of(response: aiohttp.ClientResponse) -> tuple[int, Any, Any]:
    """Status, content type and body (parsed if JSON), as `answer_in` reads a recorded one."""
    text = await response.text()
    content_type = response.headers.get("Content-Type")
    parsed = json.loads(text) if content_type and "json" in content_type else text
    return response.status, content_type, parsed


async def post(session: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any, Any]:
    data = body if isinstance(body, str) else json.dumps(body)
    async with session.post(url, data=data) as response:
        return await answer_of(response)


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any, Any]:
    async with session.get(url) as response:
        return response.status, response.headers.get("Content-Type"), await response.json()


async def posted_until(
    comfyui: ComfyUISim, session: aiohttp.ClientSession, state: PromptState
) -> dict[str, Any]:
    """The recorded accepted prompt (post_prompt_ok.json) posted, once the double holds it in
    `state`: its request body."""
    body: dict[str, Any] = transcript("post_prompt_ok.json")["request_body"]
    await post(session, f"{comfyui.url}/prompt", body)
    await comfyui.wait_until(body["prompt_id"], state)
    return body


async def messages_until_done(ws: aiohttp.ClientWebSocketResponse) -> list[dict[str, Any]]:
    """Every message up to and including the final `executing {node: null}`."""
    received = []
    async with asyncio.timeout(10):
        while True:
            message = json.loads((await ws.receive()).data)
            received.append(message)
            if message["type"] == "executing" and message["data"]["node"] is None:
                return received


# --- POST /prompt ----------------------------------------------------------------------------


async def test_accepted_prompt_answers_exactly_like_comfyui(comfyui: ComfyUISim, session):
    recorded = transcript("post_prompt_ok.json")
    answer = await post(session, f"{comfyui.url}/prompt", recorded["request_body"])
    assert answer == answer_in(recorded)


@pytest.mark.parametrize(
    "name",
    [
        "post_prompt_missing_input.json",
        "post_prompt_unknown_node.json",
        "post_prompt_no_outputs.json",
        "post_prompt_malformed_json.json",
    ],
)
async def test_rejected_prompt_answers_exactly_like_comfyui(comfyui: ComfyUISim, session, name):
    recorded = transcript(name)
    answer = await post(session, f"{comfyui.url}/prompt", recorded["request_body"])
    assert answer == answer_in(recorded)
    assert comfyui.queue_pending == comfyui.queue_running == []


GRAIN = GRAIN_GRAPH


async def test_a_node_or_a_value_a_host_lacks_is_refused_exactly_like_comfyui(
    comfyui: ComfyUISim, session
):
    url = f"{comfyui.url}/prompt"
    missing = await post(session, url, {"prompt": GRAIN})
    assert missing == recorded_answer("post_prompt_node_missing_on_host.json")
    comfyui.installed = Host(nodes=Host().nodes | {"FilmGrainLite"})
    heavy = GRAIN | {"3": {**GRAIN["3"], "inputs": {"images": ["1", 0], "grain": "heavy"}}}
    assert await post(session, url, {"prompt": heavy}) == recorded_answer(
        "post_prompt_value_not_in_list.json"
    )
    status, _, accepted = await post(session, url, {"prompt": GRAIN})
    assert status == 200 and accepted["node_errors"] == {}


async def test_what_a_host_has_is_listed_like_comfyui_lists_it(comfyui: ComfyUISim, session):
    comfyui.installed = Host(models={"checkpoints": ("only-on-b.safetensors",)})
    assert await get(session, f"{comfyui.url}/models") == recorded_answer("models_folders.json")
    checkpoints = await get(session, f"{comfyui.url}/models/checkpoints")
    assert checkpoints == recorded_answer("models_checkpoints.json")
    unknown = await get(session, f"{comfyui.url}/object_info/FilmGrainLite")
    assert unknown == recorded_answer("object_info_unknown_class.json")
    status, content_type, listed = await get(session, f"{comfyui.url}/object_info")
    assert (status, content_type) == recorded_answer("object_info_excerpt.json")[:2]
    classes = transcript("object_info_excerpt.json")["body"]
    recorded = classes["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"]
    assert listed["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0] == recorded[0]
    # The fields every recorded class has (some have more: output_tooltips, api_node, ...).
    common = set.intersection(*(set(spec) for spec in classes.values()))
    assert all(set(spec) == common for spec in listed.values())
    assert "FilmGrainLite" not in listed and "LoadImage" in listed


async def test_same_prompt_id_posted_twice_is_queued_twice_and_runs_twice(
    comfyui: ComfyUISim, session
):
    comfyui.pause()
    body = transcript("post_prompt_ok.json")["request_body"]
    for _ in range(2):
        status, _, answer = await post(session, f"{comfyui.url}/prompt", body)
        assert status == 200 and answer["prompt_id"] == body["prompt_id"]
    assert [item[1] for item in comfyui.queue_pending] == [body["prompt_id"]] * 2
    assert comfyui.prompt_posts[body["prompt_id"]] == 2

    comfyui.execution_s = 0
    comfyui.resume()
    await comfyui.wait_until(body["prompt_id"], "done")
    assert sorted(comfyui.files) == [
        "output/anim/orch_00001_.webp",
        "output/anim/orch_00002_.webp",
    ]


async def test_prompts_without_a_client_id_get_a_generated_prompt_id(comfyui: ComfyUISim, session):
    body = transcript("post_prompt_ok.json")["request_body"]
    status, _, answer = await post(session, f"{comfyui.url}/prompt", {"prompt": body["prompt"]})
    assert status == 200 and re.fullmatch(r"[0-9a-f-]{36}", answer["prompt_id"])


# --- /queue, /prompt, /interrupt -------------------------------------------------------------


async def running_and_pending(comfyui: ComfyUISim, session: aiohttp.ClientSession) -> None:
    """The recorded situation: a slow blur chain running, a small animation pending."""
    comfyui.execution_s = 30
    recorded = transcript("queue_running_and_pending.json")["body"]
    # ComfyUI numbers rejected prompts too: one rejected POST makes the numbers match (1, 2).
    await post(
        session, f"{comfyui.url}/prompt", transcript("post_prompt_no_outputs.json")["request_body"]
    )
    [running], [pending] = recorded["queue_running"], recorded["queue_pending"]
    await post(session, f"{comfyui.url}/prompt", queued_request(running))
    await comfyui.wait_until(running[1], "running")
    await post(session, f"{comfyui.url}/prompt", queued_request(pending))


async def test_queue_answers_exactly_like_comfyui_idle_and_busy(comfyui: ComfyUISim, session):
    idle = transcript("queue_idle.json")
    assert await get(session, f"{comfyui.url}/queue") == answer_in(idle)
    await running_and_pending(comfyui, session)
    busy = transcript("queue_running_and_pending.json")
    assert await get(session, f"{comfyui.url}/queue") == answer_in(busy)


async def test_get_prompt_counts_what_is_left_like_comfyui(comfyui: ComfyUISim, session):
    idle, busy = transcript("prompt_idle.json"), transcript("prompt_busy.json")
    assert await get(session, f"{comfyui.url}/prompt") == answer_in(idle)
    await running_and_pending(comfyui, session)
    assert await get(session, f"{comfyui.url}/prompt") == answer_in(busy)


async def test_deleting_a_pending_prompt_answers_an_empty_200_and_leaves_the_running_one(
    comfyui: ComfyUISim, session
):
    await running_and_pending(comfyui, session)
    recorded = transcript("queue_delete_pending.json")
    answer = await post(session, f"{comfyui.url}/queue", recorded["request_body"])
    assert answer == answer_in(recorded)
    after = transcript("queue_after_delete.json")
    assert await get(session, f"{comfyui.url}/queue") == answer_in(after)


async def test_interrupt_by_prompt_id_ends_the_running_prompt_like_comfyui(
    comfyui: ComfyUISim, session
):
    comfyui.execution_s = 2.5  # five nodes: 0.5 s each, time enough to interrupt during "10"
    prompt_id, recorded = recorded_history("history_interrupted.json")
    async with session.ws_connect(f"{comfyui.url}/ws?clientId={CLIENT}") as ws:
        await post(session, f"{comfyui.url}/prompt", queued_request(recorded["prompt"]))
        async with asyncio.timeout(5):
            while (m := json.loads((await ws.receive()).data))["type"] != "executing" or (
                m["data"]["node"] != "10"
            ):
                pass
        request = transcript("interrupt_running.json")
        answer = await post(session, f"{comfyui.url}/interrupt", request["request_body"])
        assert answer == answer_in(request)
        tail = transcript("ws_interrupted_tail.json")
        received = await messages_until_done(ws)

    assert normalised(received[-len(tail) :]) == normalised(tail)
    _, _, history = await get(session, f"{comfyui.url}/history/{prompt_id}")
    assert normalised(history[prompt_id]) == normalised(recorded) | {
        "prompt": [0, *recorded["prompt"][1:]]
    }


async def test_interrupt_naming_another_prompt_leaves_the_running_one_alone(
    comfyui: ComfyUISim, session
):
    comfyui.execution_s = 0.3
    body = await posted_until(comfyui, session, "running")
    await post(session, f"{comfyui.url}/interrupt", {"prompt_id": "someone-else"})
    await comfyui.wait_until(body["prompt_id"], "done")
    assert comfyui.history[body["prompt_id"]]["status"]["status_str"] == "success"


# --- /history --------------------------------------------------------------------------------


async def test_history_is_empty_for_unknown_and_for_unfinished_prompts(
    comfyui: ComfyUISim, session
):
    unknown = transcript("history_unknown_id.json")
    assert await get(session, f"{comfyui.url}/history/never-submitted-id") == answer_in(unknown)
    await running_and_pending(comfyui, session)
    while_running = transcript("history_while_running.json")
    for prompt_id in [item[1] for item in comfyui.queue_running + comfyui.queue_pending]:
        status, content_type, body = await get(session, f"{comfyui.url}/history/{prompt_id}")
        assert (status, content_type, body) == (200, while_running["content_type"], {})


@pytest.mark.parametrize("name", ["history_success.json", "history_video_success.json"])
async def test_finished_prompt_history_matches_comfyui(comfyui: ComfyUISim, session, name):
    comfyui.execution_s = 0
    prompt_id, recorded = recorded_history(name)
    await post(session, f"{comfyui.url}/prompt", queued_request(recorded["prompt"]))
    await comfyui.wait_until(prompt_id, "done")
    status, content_type, body = await get(session, f"{comfyui.url}/history/{prompt_id}")
    assert (status, content_type) == (200, transcript(name)["content_type"])
    expected = normalised(recorded) | {"prompt": [0, *recorded["prompt"][1:]]}
    assert normalised(body[prompt_id]) == expected
    _, _, everything = await get(session, f"{comfyui.url}/history")
    assert list(everything) == [prompt_id]


async def test_failed_prompt_history_carries_the_exception_like_comfyui(
    comfyui: ComfyUISim, session
):
    comfyui.execution_s = 0
    comfyui.fail_next()
    prompt_id, recorded = recorded_history("history_execution_error.json")
    await post(session, f"{comfyui.url}/prompt", queued_request(recorded["prompt"]))
    await comfyui.wait_until(prompt_id, "done")
    _, _, body = await get(session, f"{comfyui.url}/history/{prompt_id}")
    entry, expected = body[prompt_id], recorded
    assert entry["outputs"] == expected["outputs"] == {}
    assert {k: v for k, v in entry["status"].items() if k != "messages"} == {
        "status_str": "error",
        "completed": False,
    }
    kinds = [kind for kind, _ in entry["status"]["messages"]]
    assert kinds == [kind for kind, _ in expected["status"]["messages"]]
    error, expected_error = (
        entry["status"]["messages"][-1][1],
        expected["status"]["messages"][-1][1],
    )
    assert error.keys() == expected_error.keys()
    for key in (
        "prompt_id",
        "node_id",
        "node_type",
        "executed",
        "exception_message",
        "exception_type",
    ):
        assert error[key] == expected_error[key]


# --- /view -----------------------------------------------------------------------------------


async def test_view_streams_the_output_with_comfyuis_headers(comfyui: ComfyUISim, session):
    comfyui.execution_s = 0
    await posted_until(comfyui, session, "done")
    recorded = transcript("view_headers.json")
    query = {"filename": "orch_00001_.webp", "subfolder": "anim", "type": "output"}
    async with session.get(f"{comfyui.url}/view", params=query) as response:
        content = await response.read()
        assert response.status == recorded["status"]
        headers = {k: response.headers[k] for k in recorded["headers"]}
    assert headers == recorded["headers"] | {"Content-Disposition": 'filename="orch_00001_.webp"'}
    assert hashlib.sha256(content).hexdigest() == comfyui.expected_sha256(
        "orch_00001_.webp", "anim"
    )


async def test_view_of_a_large_output_streams_its_exact_bytes(comfyui: ComfyUISim, session):
    comfyui.execution_s = 0
    comfyui.output_bytes = 5 * 1024 * 1024 + 3
    await posted_until(comfyui, session, "done")
    digest, size = hashlib.sha256(), 0
    query = {"filename": "orch_00001_.webp", "subfolder": "anim"}
    async with session.get(f"{comfyui.url}/view", params=query) as response:
        async for chunk in response.content.iter_chunked(1 << 16):
            digest.update(chunk)
            size += len(chunk)
    assert size == comfyui.output_bytes
    assert digest.hexdigest() == comfyui.expected_sha256("orch_00001_.webp", "anim")


@pytest.mark.parametrize(
    ("query", "status"),
    [
        ({"filename": "../secret.webp", "subfolder": "anim"}, 400),
        ({"filename": "/etc/passwd"}, 400),
        ({"filename": "orch_00001_.webp", "subfolder": "../../etc"}, 403),
        ({"filename": "orch_00001_.webp", "subfolder": "anim", "type": "elsewhere"}, 400),
        ({"filename": "never_00001_.webp", "subfolder": "anim"}, 404),
    ],
)
async def test_view_refuses_paths_outside_comfyuis_folders_like_comfyui(
    comfyui: ComfyUISim, session, query, status
):
    async with session.get(f"{comfyui.url}/view", params=query) as response:
        assert response.status == status


# --- POST /upload/image, LoadImage, "front" ----------------------------------------------------

START = "3f2a9c-start.png"  # the recorded upload's name and subfolder
FOLDER = "spillway/job-1"


async def upload(
    session: aiohttp.ClientSession,
    comfyui: ComfyUISim,
    data: bytes,
    *,
    name: str = START,
    subfolder: str = FOLDER,
    overwrite: bool = False,
) -> tuple[int, Any, Any]:
    form = aiohttp.FormData()
    form.add_field("image", data, filename=name, content_type="image/png")
    form.add_fields(
        ("subfolder", subfolder), ("type", "input"), ("overwrite", str(overwrite).lower())
    )
    async with session.post(f"{comfyui.url}/upload/image", data=form) as response:
        return await answer_of(response)


async def test_uploads_answer_like_comfyui_reusing_renaming_and_overwriting(
    comfyui: ComfyUISim, session
):
    first, other = b"\x89PNG first image", b"\x89PNG another image"
    assert await upload(session, comfyui, first) == recorded_answer("upload_image_new.json")
    # The same name and the same bytes: the file is reused.
    assert await upload(session, comfyui, first) == recorded_answer(
        "upload_image_same_name_no_overwrite.json"
    )
    # The same name, other bytes, no overwrite: stored under a new name.
    assert await upload(session, comfyui, other) == recorded_answer(
        "upload_image_same_name_other_content.json"
    )
    # With overwrite the name stays and the bytes are replaced.
    answer = await upload(session, comfyui, other, overwrite=True)
    assert answer == recorded_answer("upload_image_overwrite.json")
    assert comfyui.inputs.files == {
        f"{FOLDER}/{START}": other,
        f"{FOLDER}/3f2a9c-start (1).png": other,
    }
    assert await upload(session, comfyui, first, subfolder="../escape") == recorded_answer(
        "upload_image_bad_subfolder.json"
    )


async def test_loadimage_of_an_uploaded_file_runs_and_its_history_matches_comfyui(
    comfyui: ComfyUISim, session
):
    comfyui.execution_s = 0
    await upload(session, comfyui, b"\x89PNG start frame")
    request = transcript("post_prompt_loadimage_subfolder.json")["request"]["json"]
    status, content_type, answer = await post(session, f"{comfyui.url}/prompt", request)
    expected = recorded_answer("post_prompt_loadimage_subfolder.json")
    assert (status, content_type, answer) == (*expected[:2], expected[2] | {"number": 0})

    prompt_id, entry = recorded_history("history_loadimage_success.json")
    await comfyui.wait_until(prompt_id, "done")
    _, _, body = await get(session, f"{comfyui.url}/history/{prompt_id}")
    assert normalised(body[prompt_id]) == normalised(entry) | {"prompt": [0, *entry["prompt"][1:]]}


async def test_loadimage_of_a_missing_file_fails_at_post_time_like_comfyui(
    comfyui: ComfyUISim, session
):
    request = transcript("post_prompt_loadimage_missing_file.json")["request"]["json"]
    answer = await post(session, f"{comfyui.url}/prompt", request)
    assert answer == recorded_answer("post_prompt_loadimage_missing_file.json")
    assert comfyui.queue_pending == comfyui.queue_running == []


async def test_a_prompt_posted_with_front_is_queued_first_with_a_negative_number(
    comfyui: ComfyUISim, session
):
    comfyui.pause()
    await upload(session, comfyui, b"\x89PNG start frame")
    later = transcript("post_prompt_ok.json")["request_body"]
    for _ in range(2):
        await post(session, f"{comfyui.url}/prompt", later)
    request = transcript("post_prompt_front.json")["request"]["json"]
    status, content_type, answer = await post(session, f"{comfyui.url}/prompt", request)

    expected = recorded_answer("post_prompt_front.json")
    assert (status, content_type, answer) == (*expected[:2], expected[2] | {"number": -2})
    assert [item[1] for item in comfyui.queue_pending] == [
        request["prompt_id"],
        later["prompt_id"],
        later["prompt_id"],
    ]
    comfyui.execution_s = 0
    comfyui.resume()
    await comfyui.wait_until(later["prompt_id"], "done")
    assert list(comfyui.history) == [request["prompt_id"], later["prompt_id"]]  # ran first


# --- WebSocket -------------------------------------------------------------------------------


async def test_websocket_sends_the_recorded_message_sequence_of_a_successful_run(
    comfyui: ComfyUISim, session
):
    comfyui.execution_s = 0.01
    recorded = [
        {k: v for k, v in m.items() if k != "t_ms"} for m in transcript("ws_success_sequence.json")
    ]
    async with session.ws_connect(f"{comfyui.url}/ws?clientId={CLIENT}") as ws:
        await post(
            session, f"{comfyui.url}/prompt", transcript("post_prompt_ok.json")["request_body"]
        )
        received = await messages_until_done(ws)
    assert normalised(received) == normalised(recorded)


async def test_websocket_sends_the_recorded_tail_of_a_failing_run(comfyui: ComfyUISim, session):
    comfyui.execution_s = 0
    comfyui.fail_next()
    _, history = recorded_history("history_execution_error.json")
    tail = transcript("ws_error_tail.json")
    async with session.ws_connect(f"{comfyui.url}/ws?clientId={CLIENT}") as ws:
        await post(session, f"{comfyui.url}/prompt", queued_request(history["prompt"]))
        received = await messages_until_done(ws)

    received = received[-len(tail) :]
    assert [m["type"] for m in received] == [m["type"] for m in tail]
    error_at = [m["type"] for m in tail].index("execution_error")
    assert received[error_at]["data"].keys() == tail[error_at]["data"].keys()
    del received[error_at], tail[error_at]
    assert normalised(received) == normalised(tail)


async def test_progress_bar_nodes_send_progress_messages(comfyui: ComfyUISim, session):
    comfyui.execution_s = 0.01
    comfyui.progress_steps = 3
    comfyui.progress_nodes.add("ImageBlur")
    _, history = recorded_history("history_interrupted.json")  # the blur chain
    async with session.ws_connect(f"{comfyui.url}/ws?clientId={CLIENT}") as ws:
        await post(session, f"{comfyui.url}/prompt", queued_request(history["prompt"]))
        received = await messages_until_done(ws)
    progress = [m["data"] for m in received if m["type"] == "progress"]
    assert [(p["node"], p["value"], p["max"]) for p in progress] == [
        (node, step, 3) for node in ("10", "11", "12") for step in (1, 2, 3)
    ]
    assert all(p["prompt_id"] == history["prompt"][1] for p in progress)


async def test_only_the_submitting_client_hears_about_its_prompt(comfyui: ComfyUISim, session):
    comfyui.execution_s = 0
    async with (
        session.ws_connect(f"{comfyui.url}/ws?clientId={CLIENT}") as mine,
        session.ws_connect(f"{comfyui.url}/ws?clientId=bystander") as other,
    ):
        await post(
            session, f"{comfyui.url}/prompt", transcript("post_prompt_ok.json")["request_body"]
        )
        await messages_until_done(mine)
        await asyncio.sleep(0.05)
        heard = []
        with contextlib.suppress(TimeoutError):  # until nothing more comes
            while True:
                heard.append(json.loads((await other.receive(timeout=0.05)).data)["type"])
    assert set(heard) == {"status"}


async def test_reconnecting_client_is_told_the_node_running_now(comfyui: ComfyUISim, session):
    comfyui.execution_s = 5.0
    _, history = recorded_history("history_interrupted.json")
    await post(session, f"{comfyui.url}/prompt", queued_request(history["prompt"]))
    await comfyui.wait_until(history["prompt"][1], "running")
    async with session.ws_connect(f"{comfyui.url}/ws?clientId={CLIENT}") as ws:
        greeting, current = [json.loads((await ws.receive()).data) for _ in range(2)]
    assert greeting["type"] == "status" and greeting["data"]["sid"] == CLIENT
    assert current == {"type": "executing", "data": {"node": "1"}}


async def test_silent_socket_hears_nothing_while_history_still_completes(
    comfyui: ComfyUISim, session
):
    comfyui.execution_s = 0.05
    comfyui.ws_silent_after = 1  # the greeting, then nothing
    body = transcript("post_prompt_ok.json")["request_body"]
    async with session.ws_connect(f"{comfyui.url}/ws?clientId={CLIENT}") as ws:
        greeting = json.loads((await ws.receive()).data)
        await post(session, f"{comfyui.url}/prompt", body)
        await comfyui.wait_until(body["prompt_id"], "done")
        with pytest.raises(TimeoutError):
            await ws.receive(timeout=0.1)
    assert greeting["type"] == "status"
    assert comfyui.ws_withheld > 0
    assert comfyui.history[body["prompt_id"]]["status"]["status_str"] == "success"


# --- restart and the rest --------------------------------------------------------------------


async def test_restart_forgets_queue_and_history_closes_sockets_and_keeps_files(
    comfyui: ComfyUISim, session
):
    comfyui.execution_s = 0
    done = await posted_until(comfyui, session, "done")
    comfyui.execution_s = 30
    _, slow = recorded_history("history_interrupted.json")
    await post(session, f"{comfyui.url}/prompt", queued_request(slow["prompt"]))
    await comfyui.wait_until(slow["prompt"][1], "running")

    async with session.ws_connect(f"{comfyui.url}/ws?clientId={CLIENT}") as ws:
        await comfyui.restart()
        async with asyncio.timeout(5):
            while (await ws.receive()).type not in (
                aiohttp.WSMsgType.CLOSE,
                aiohttp.WSMsgType.CLOSED,
            ):
                pass

    assert await get(session, f"{comfyui.url}/queue") == (
        200,
        "application/json; charset=utf-8",
        {"queue_running": [], "queue_pending": []},
    )
    for prompt_id in (done["prompt_id"], slow["prompt"][1]):
        assert (await get(session, f"{comfyui.url}/history/{prompt_id}"))[2] == {}
    query = {"filename": "orch_00001_.webp", "subfolder": "anim"}
    async with session.get(f"{comfyui.url}/view", params=query) as response:
        assert response.status == 200  # files on disk survive a restart
    comfyui.execution_s = 0
    _, _, answer = await post(session, f"{comfyui.url}/prompt", done)
    assert answer["number"] == 0  # numbering starts over


async def test_system_stats_has_the_fields_comfyui_reports(comfyui: ComfyUISim, session):
    recorded = transcript("system_stats.json")
    status, content_type, body = await get(session, f"{comfyui.url}/system_stats")
    assert (status, content_type) == (200, recorded["content_type"])
    assert body.keys() == recorded["body"].keys()
    assert body["system"].keys() == recorded["body"]["system"].keys()
    assert body["devices"][0].keys() == recorded["body"]["devices"][0].keys()
