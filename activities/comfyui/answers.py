"""Reading ComfyUI's answers: pure functions of what ComfyUI 0.3.64 sends (docs/design.md,
"ComfyUI facts"), tested on the recorded transcripts in tests/comfyui_transcripts/.

Nothing here talks to ComfyUI or Temporal: the client fetches, these functions read, and the
activities turn what they read into results and ApplicationErrors. Answers are `Any` on purpose:
ComfyUI's JSON has no schema, and a field of an unexpected shape is read as missing rather than
crashing the worker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from activities.comfyui.models import EXECUTION_FAILED, INTERRUPTED, ComfyUIFile, ComfyUIFinished
from spillway.core.models import Progress

OUTPUT_KINDS = ("images", "gifs", "videos")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")

Queued = Literal["pending", "running"]
Where = Literal["pending", "running", "done", "absent"]


class MalformedAnswer(ValueError):
    """An answer that is JSON but not shaped like ComfyUI's (a proxy's, another server's)."""


class UnsafePath(ValueError):
    """An output name (or job id) that would put a file outside the job's folder."""


@dataclass(frozen=True)
class Seen:
    """Where a prompt is: `absent` means neither queued nor in history (LOST, if it stays so)."""

    where: Where
    entry: dict[str, Any] | None = None  # the history entry, when `done`


@dataclass(frozen=True)
class PromptFailed:
    """A prompt that ended in an error or an interrupt: the activity fails with `error_type`."""

    error_type: str  # comfyui_models.EXECUTION_FAILED or INTERRUPTED
    message: str
    details: dict[str, Any] | None = None


# --- where a prompt is -----------------------------------------------------------------------


def queue_place(queue: Any, prompt_id: str) -> Queued | None:
    """Where `GET /queue` has the prompt; None when in neither list."""
    return queue_places(queue).get(prompt_id)


def queue_places(queue: Any) -> dict[str, Queued]:
    """Every prompt `GET /queue` lists, and where: one read answers for all the prompts an agent
    waits on. Items are `[number, prompt_id, prompt, extra, outputs]`."""
    if not isinstance(queue, dict):
        raise MalformedAnswer("GET /queue answered something other than a JSON object")
    places: dict[str, Queued] = {}
    # Pending first, so a prompt listed in both (never seen, but cheap to order) reads running.
    for where, key in (("pending", "queue_pending"), ("running", "queue_running")):
        items = queue.get(key)
        if not isinstance(items, list):
            raise MalformedAnswer(f"GET /queue answered without a {key} list")
        for item in items:
            if isinstance(item, list) and len(item) > 1 and isinstance(item[1], str):
                places[item[1]] = "running" if where == "running" else "pending"
    return places


def history_entry(history: Any, prompt_id: str) -> dict[str, Any] | None:
    """The prompt's entry in `GET /history/{id}`. `{}` (None here) is ComfyUI's answer both while
    a prompt is pending or running AND for an id it never saw: only /queue tells them apart."""
    entry = history.get(prompt_id) if isinstance(history, dict) else None
    return entry if isinstance(entry, dict) else None


# --- how a prompt ended ----------------------------------------------------------------------


def _render_s(messages: list[list[Any]]) -> float | None:
    """ComfyUI's own execution_start to execution_success (ms timestamps): the render, without
    the queue before it or a restart's lost attempt."""
    marks = {kind: _dict(data).get("timestamp") for kind, data in messages}
    start, end = marks.get("execution_start"), marks.get("execution_success")
    if not isinstance(start, int | float) or not isinstance(end, int | float) or end < start:
        return None
    return round((end - start) / 1000, 3)


def outcome_of(prompt_id: str, entry: dict[str, Any]) -> ComfyUIFinished | PromptFailed:
    """A history entry's verdict: success with its files, or the last error or interrupt among
    its status messages."""
    status = _dict(entry.get("status"))
    messages = [m for m in status.get("messages") or [] if isinstance(m, list) and len(m) == 2]
    if status.get("status_str") == "success":
        files = files_of(_dict(entry.get("outputs")))
        return ComfyUIFinished(
            prompt_id=prompt_id, outcome="success", files=files, render_s=_render_s(messages)
        )
    for kind, raw in reversed(messages):
        data = _dict(raw)
        if kind == "execution_interrupted":
            return PromptFailed(
                INTERRUPTED,
                f"ComfyUI interrupted prompt {prompt_id} at node {data.get('node_id')} "
                f"({data.get('node_type')})",
                data,
            )
        if kind == "execution_error":
            message = str(data.get("exception_message", "")).strip()
            return PromptFailed(
                EXECUTION_FAILED,
                f"ComfyUI failed in node {data.get('node_id')} ({data.get('node_type')}): "
                f"{data.get('exception_type')}: {message}",
                # The traceback stays out: it is long and names paths on the ComfyUI machine.
                {k: data.get(k) for k in ("node_id", "node_type", "exception_type")}
                | {"exception_message": message},
            )
    return PromptFailed(
        EXECUTION_FAILED,
        f"ComfyUI ended prompt {prompt_id} with status {status.get('status_str')!r} and no error",
    )


def files_of(outputs: dict[str, Any]) -> list[ComfyUIFile]:
    """Every file in history outputs: `images` (stills, and videos and animations, marked by
    "animated": [true]), `gifs` (VideoHelperSuite's videos) and `videos`."""
    files = []
    for node_id, output in outputs.items():
        if not isinstance(output, dict):
            continue
        animated = any(output.get("animated") or [])
        for kind in OUTPUT_KINDS:
            for item in output.get(kind) or []:
                if isinstance(item, dict) and isinstance(item.get("filename"), str):
                    files.append(
                        ComfyUIFile(
                            node_id=str(node_id),
                            kind=kind,
                            filename=item["filename"],
                            subfolder=str(item.get("subfolder") or ""),
                            type=str(item.get("type") or "output"),
                            animated=animated or kind != "images",
                        )
                    )
    return files


# --- why a graph was refused -----------------------------------------------------------------


def rejection_message(answer: Any, graph: dict[str, Any]) -> str:
    """One line naming each failing node, its class and why, in ComfyUI's own words, from a 400
    or from the `node_errors` of a 200."""
    answer = answer if isinstance(answer, dict) else {}
    parts = []
    for node_id, node in _dict(answer.get("node_errors")).items():
        node = _dict(node)
        reasons = "; ".join(
            f"{e.get('message')}: {e.get('details')}" if e.get("details") else str(e.get("message"))
            for e in node.get("errors") or []
            if isinstance(e, dict)
        )
        parts.append(
            f"node {node_id} ({node.get('class_type') or _class_of(graph, node_id)}): {reasons}"
        )
    error = answer.get("error") if isinstance(answer.get("error"), dict) else None
    if not parts and error is not None:
        # An unknown node class comes without node_errors; only `details` names the node.
        details = str(error.get("details") or "")
        if named := re.fullmatch(r"Node ID '#(.+)'", details):
            node_id = named.group(1)
            parts.append(f"node {node_id} ({_class_of(graph, node_id)}): {error.get('message')}")
        else:
            hint = (
                ": add a save node (SaveVideo, ...)"
                if error.get("type") == "prompt_no_outputs"
                else ""
            )
            parts.append(f"{error.get('message')} ({error.get('type')}){hint}")
    return "ComfyUI rejected the graph: " + ("; ".join(parts) or "no reason given")


def _class_of(graph: dict[str, Any], node_id: str) -> str:
    node = graph.get(node_id)
    return str(node.get("class_type")) if isinstance(node, dict) else "?"


# --- the WebSocket ---------------------------------------------------------------------------


def socket_prompt(message: Any) -> str | None:
    """The prompt a /ws message names, if any: `status` names none, and neither does the
    `executing` ComfyUI sends on a reconnect (it goes only to the running prompt's client)."""
    data = message.get("data") if isinstance(message, dict) else None
    prompt_id = data.get("prompt_id") if isinstance(data, dict) else None
    return prompt_id if isinstance(prompt_id, str) else None


def socket_news(message: Any, prompt_id: str) -> Progress | Literal["ended"] | None:
    """What one /ws message says about the prompt: its progress, "ended" (its history is written:
    look now), or None (nothing about this prompt, or nothing to act on). How the prompt ended is
    read from history, never from here: the socket may stall or miss messages."""
    if not isinstance(message, dict) or not isinstance(message.get("data"), dict):
        return None
    kind, data = message.get("type"), message["data"]
    # The socket carries every prompt of this client (earlier attempts included); a
    # reconnect's "executing" names no prompt but only goes to the running prompt's client.
    if data.get("prompt_id", prompt_id) != prompt_id:
        return None
    if kind == "execution_start":
        return Progress(phase="running")
    if kind == "executing" and data.get("node") is not None:
        return Progress(phase="running", node=str(data["node"]))
    if kind == "progress":
        value, maximum = data.get("value"), data.get("max")
        if isinstance(value, int | float) and isinstance(maximum, int | float) and maximum:
            return Progress(
                phase="running",
                node=None if data.get("node") is None else str(data["node"]),
                value=int(value),
                max=int(maximum),
                percent=round(100 * value / maximum, 1),
            )
        return None
    if kind == "executing":
        # `executing {node: null}` comes after ComfyUI wrote history: the safe end signal.
        # execution_success/_error/_interrupted come before it is written: a look then would
        # find `{}`, one request per prompt for nothing.
        return "ended"
    return None


# --- inputs ----------------------------------------------------------------------------------


def uploaded_name(answer: Any) -> str | None:
    """`<subfolder>/<name>` from POST /upload/image's `{"name", "subfolder", "type"}`, as
    LoadImage takes it; None when the answer has no name."""
    name = answer.get("name") if isinstance(answer, dict) else None
    if not isinstance(name, str) or not name:
        return None
    subfolder = answer.get("subfolder")
    return f"{subfolder}/{name}" if isinstance(subfolder, str) and subfolder else name


# --- where outputs land ----------------------------------------------------------------------


def job_folder(output_dir: Path, job_id: str) -> Path:
    """The job's own folder under SPILLWAY_OUTPUT_DIR (resolved)."""
    if not _JOB_ID.match(job_id):
        raise UnsafePath(f"job id {job_id!r} cannot name a folder")
    return (output_dir / job_id).resolve()


def output_name(file: ComfyUIFile) -> str:
    """The output's name inside the job's folder or prefix: `<subfolder>/<filename>`, refusing
    any name that would escape it (ComfyUI names come from the graph, which a user wrote)."""
    subfolder = file.subfolder.replace("\\", "/")
    if subfolder.startswith("/"):
        raise _unsafe(file)
    folders = [p for p in subfolder.split("/") if p not in ("", ".")]
    names = [*folders, file.filename]
    if (
        any(n == ".." or n.startswith(".") or "\x00" in n for n in names)
        or not file.filename
        or ("/" in file.filename or "\\" in file.filename)
    ):
        raise _unsafe(file)
    return "/".join(names)


def output_path(job_dir: Path, file: ComfyUIFile) -> Path:
    """Where a ComfyUI output lands in a local job folder (`output_name` under it). Reads the
    disk only to resolve symlinks already inside the job's folder."""
    target = job_dir.joinpath(*output_name(file).split("/"))
    if not target.resolve().is_relative_to(job_dir):
        raise _unsafe(file)  # a symlink inside the job folder pointing elsewhere
    return target


def _unsafe(file: ComfyUIFile) -> UnsafePath:
    return UnsafePath(
        f"refusing ComfyUI output {file.subfolder!r}/{file.filename!r}: it would be written "
        "outside the job's folder"
    )


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
