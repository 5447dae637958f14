"""Reading ComfyUI's answers, straight off the answers a real ComfyUI 0.3.64 gave
(tests/comfyui_transcripts/): how a prompt ended, where it is, why a graph was refused, what the
socket says, and where its files may land."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from activities.comfyui.answers import (
    MalformedAnswer,
    PromptFailed,
    UnsafePath,
    files_of,
    history_entry,
    job_folder,
    outcome_of,
    output_path,
    queue_place,
    queue_places,
    rejection_message,
    socket_news,
    socket_prompt,
)
from activities.comfyui.models import EXECUTION_FAILED, INTERRUPTED, ComfyUIFile, ComfyUIFinished
from spillway.core.models import Progress
from tests.support.comfyui import ESCAPING_OUTPUTS

TRANSCRIPTS = Path(__file__).resolve().parent / "comfyui_transcripts"


def recorded(name: str) -> Any:
    return json.loads((TRANSCRIPTS / f"{name}.json").read_text())


def history(name: str) -> tuple[str, dict[str, Any]]:
    """The one (prompt_id, entry) of a recorded GET /history/{id}."""
    [(prompt_id, entry)] = recorded(name)["body"].items()
    return prompt_id, entry


# --- how a prompt ended ----------------------------------------------------------------------


def test_recorded_success_ends_with_its_animation_as_the_output():
    prompt_id, entry = history("history_success")
    assert outcome_of(prompt_id, entry) == ComfyUIFinished(
        prompt_id=prompt_id,
        outcome="success",
        files=[
            ComfyUIFile(
                node_id="2",
                kind="images",
                filename="orch_00048_.webp",
                subfolder="anim",
                animated=True,
            )
        ],
        render_s=0.012,  # its execution_start at ...807 ms, execution_success at ...819
    )


def test_recorded_video_comes_under_images_marked_animated():
    prompt_id, entry = history("history_video_success")
    outcome = outcome_of(prompt_id, entry)
    assert isinstance(outcome, ComfyUIFinished)
    assert [(f.kind, f.subfolder, f.filename, f.animated) for f in outcome.files] == [
        ("images", "video", "err_00001_.mp4", True)
    ]


def test_output_files_are_read_from_images_gifs_and_videos_of_every_node():
    _, entry = history("history_video_success")
    outputs: dict[str, Any] = entry["outputs"] | {
        "7": {"videos": [{"filename": "clip.mp4", "subfolder": "", "type": "output"}]},
        "8": {
            "gifs": [
                {"filename": "loop.gif", "subfolder": "g", "type": "temp", "format": "image/gif"}
            ]
        },
        "9": {"text": ["not a file"]},
    }
    assert files_of(outputs) == [
        ComfyUIFile(
            node_id="3", kind="images", filename="err_00001_.mp4", subfolder="video", animated=True
        ),
        ComfyUIFile(node_id="7", kind="videos", filename="clip.mp4", animated=True),
        ComfyUIFile(
            node_id="8", kind="gifs", filename="loop.gif", subfolder="g", type="temp", animated=True
        ),
    ]


def test_recorded_execution_error_names_node_class_and_comfyuis_exception_without_traceback():
    prompt_id, entry = history("history_execution_error")
    failed = outcome_of(prompt_id, entry)
    assert failed == PromptFailed(
        EXECUTION_FAILED,
        "ComfyUI failed in node 3 (SaveVideo): av.error.ExternalError: [Errno 542398533] "
        "Generic error in an external library: 'avcodec_open2(\"libx264\", {})'",
        {
            "node_id": "3",
            "node_type": "SaveVideo",
            "exception_type": "av.error.ExternalError",
            "exception_message": "[Errno 542398533] Generic error in an external library: "
            "'avcodec_open2(\"libx264\", {})'",
        },
    )


def test_recorded_interrupt_names_the_node_it_stopped_at():
    prompt_id, entry = history("history_interrupted")
    failed = outcome_of(prompt_id, entry)
    assert isinstance(failed, PromptFailed) and failed.error_type == INTERRUPTED
    assert failed.message == f"ComfyUI interrupted prompt {prompt_id} at node 11 (ImageBlur)"


def test_error_status_without_an_error_message_still_fails_the_prompt():
    prompt_id, entry = history("history_execution_error")
    entry["status"]["messages"] = entry["status"]["messages"][:1]  # execution_start only
    assert outcome_of(prompt_id, entry) == PromptFailed(
        EXECUTION_FAILED,
        f"ComfyUI ended prompt {prompt_id} with status 'error' and no error",
    )


# --- where a prompt is -----------------------------------------------------------------------


def test_empty_history_is_the_same_answer_for_a_running_prompt_and_an_unknown_one():
    assert (
        history_entry(recorded("history_while_running")["body"], "job-capture-slow-b148e4") is None
    )
    assert history_entry(recorded("history_unknown_id")["body"], "never-submitted-id") is None
    prompt_id, entry = history("history_success")
    assert history_entry(recorded("history_success")["body"], prompt_id) == entry


def test_queue_says_which_prompt_runs_and_which_waits():
    both = recorded("queue_running_and_pending")["body"]
    assert queue_place(both, "job-capture-slow-b148e4") == "running"
    assert queue_place(both, "job-capture-pend-373907") == "pending"
    assert queue_place(both, "never-submitted-id") is None
    after_delete = recorded("queue_after_delete")["body"]
    assert queue_place(after_delete, "job-capture-pend-373907") is None
    assert queue_place(recorded("queue_idle")["body"], "job-capture-slow-b148e4") is None


def test_one_queue_read_places_every_prompt_for_all_waits_at_once():
    assert queue_places(recorded("queue_running_and_pending")["body"]) == {
        "job-capture-slow-b148e4": "running",
        "job-capture-pend-373907": "pending",
    }
    assert queue_places(recorded("queue_idle")["body"]) == {}


@pytest.mark.parametrize("answer", [{"queue_running": []}, {"queue_pending": None}, [], "busy"])
def test_queue_answer_not_shaped_like_comfyuis_is_malformed_not_empty(answer: Any):
    # Read as "not queued" it would count towards LOST, and a lost prompt is submitted again.
    with pytest.raises(MalformedAnswer):
        queue_place(answer, "job-capture-slow-b148e4")


# --- why a graph was refused -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (
            "post_prompt_missing_input",
            "ComfyUI rejected the graph: node 2 (SaveAnimatedWEBP): Required input is missing: fps",
        ),
        (
            "post_prompt_unknown_node",
            "ComfyUI rejected the graph: node 1 (NoSuchNode): "
            "Cannot execute because node NoSuchNode does not exist.",
        ),
        (
            "post_prompt_no_outputs",
            "ComfyUI rejected the graph: Prompt has no outputs (prompt_no_outputs): "
            "add a save node (SaveVideo, ...)",
        ),
    ],
)
def test_recorded_rejection_names_each_node_its_class_and_why(name: str, expected: str):
    transcript = recorded(name)
    assert transcript["status"] == 400
    assert rejection_message(transcript["body"], transcript["request_body"]["prompt"]) == expected


def test_node_error_without_its_class_takes_the_class_from_the_graph():
    transcript = recorded("post_prompt_missing_input")
    answer = transcript["body"]
    del answer["node_errors"]["2"]["class_type"]
    assert rejection_message(answer, transcript["request_body"]["prompt"]).startswith(
        "ComfyUI rejected the graph: node 2 (SaveAnimatedWEBP): "
    )


@pytest.mark.parametrize("answer", [None, {}, "500 Internal Server Error"])
def test_rejection_without_comfyuis_reasons_says_so(answer: Any):
    assert rejection_message(answer, {}) == "ComfyUI rejected the graph: no reason given"


# --- the WebSocket ---------------------------------------------------------------------------


def test_recorded_successful_run_reads_as_running_nodes_then_ended():
    messages = recorded("ws_success_sequence")
    news = [socket_news(m, "job-capture-ok-b4a9cf") for m in messages]
    assert [n for n in news if n is not None] == [
        Progress(phase="running"),
        Progress(phase="running", node="1"),
        Progress(phase="running", node="2"),
        "ended",  # executing {node: null}, after history is written; not execution_success
    ]


@pytest.mark.parametrize("name", ["ws_error_tail", "ws_interrupted_tail"])
def test_recorded_error_and_interrupt_end_the_prompt_once_history_is_written(name: str):
    messages = recorded(name)
    prompt_id = next(m["data"]["prompt_id"] for m in messages if "prompt_id" in m["data"])
    assert messages[-1]["type"] == "executing" and messages[-1]["data"]["node"] is None
    assert socket_news(messages[-1], prompt_id) == "ended"
    assert "ended" not in [socket_news(m, prompt_id) for m in messages[:-1]]


def test_socket_messages_name_their_prompt_except_status_and_a_reconnects_executing():
    messages = recorded("ws_success_sequence")
    assert socket_prompt(messages[0]) is None  # status
    assert {socket_prompt(m) for m in messages[3:]} == {"job-capture-ok-b4a9cf", None}
    assert socket_prompt({"type": "executing", "data": {"node": "3"}}) is None


def test_messages_of_another_prompt_of_the_same_client_say_nothing():
    messages = recorded("ws_success_sequence")
    assert {socket_news(m, "spillway-job-1-2") for m in messages} == {None}


def test_node_progress_becomes_a_percentage():
    message = {"type": "progress", "data": {"value": 2, "max": 4, "prompt_id": "p", "node": "11"}}
    assert socket_news(message, "p") == Progress(
        phase="running", node="11", value=2, max=4, percent=50.0
    )
    assert socket_news({"type": "progress", "data": {"value": 0, "max": 0}}, "p") is None


def test_executing_without_a_prompt_id_after_a_reconnect_is_this_clients_running_prompt():
    assert socket_news({"type": "executing", "data": {"node": "3"}}, "p") == Progress(
        phase="running", node="3"
    )


@pytest.mark.parametrize("message", [None, "text", {"type": "status"}, {"data": []}])
def test_messages_not_shaped_like_comfyuis_say_nothing(message: Any):
    assert socket_news(message, "p") is None


# --- where outputs land ----------------------------------------------------------------------


def test_output_lands_in_its_subfolder_of_the_job_folder(tmp_path: Path):
    job_dir = job_folder(tmp_path, "job-1")
    file = ComfyUIFile(node_id="3", kind="images", filename="job_00001_.mp4", subfolder="video")
    assert output_path(job_dir, file) == tmp_path.resolve() / "job-1" / "video" / "job_00001_.mp4"


@pytest.mark.parametrize(("subfolder", "filename"), ESCAPING_OUTPUTS)
def test_output_names_that_would_leave_the_job_folder_are_refused(
    tmp_path: Path, subfolder: str, filename: str
):
    bad = ComfyUIFile(node_id="9", kind="images", filename=filename, subfolder=subfolder)
    with pytest.raises(UnsafePath, match="outside the job's folder"):
        output_path(job_folder(tmp_path, "job-1"), bad)


def test_a_symlink_inside_the_job_folder_cannot_lead_outside(tmp_path: Path):
    job_dir = job_folder(tmp_path / "outputs", "job-1")
    job_dir.mkdir(parents=True)
    (job_dir / "video").symlink_to(tmp_path)
    file = ComfyUIFile(node_id="3", kind="images", filename="x.mp4", subfolder="video")
    with pytest.raises(UnsafePath):
        output_path(job_dir, file)


@pytest.mark.parametrize("job_id", ["", "..", "../x", "a/b", ".hidden", "x" * 101])
def test_job_ids_that_cannot_name_a_folder_are_refused(tmp_path: Path, job_id: str):
    with pytest.raises(UnsafePath, match="cannot name a folder"):
        job_folder(tmp_path, job_id)
