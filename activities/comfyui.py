"""The LOCAL route: submit a graph to ComfyUI once, follow it to its end, bring its files home,
and take it back out of ComfyUI when the job is cancelled (DESIGN.md, "ComfyUI facts").

ComfyUI keeps its queue and history in memory and never deduplicates a prompt_id, so every
decision here is read off `/queue` (first) and `/history/{id}` (second): a prompt finishing
between the two reads is then seen in history, never as missing. The WebSocket only brings
progress and wakes the poll early; the poll alone decides how a prompt ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import aiohttp
import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import files
from spillway import comfyui_models as errors
from spillway.comfyui_models import (
    ComfyUICancel,
    ComfyUICancelled,
    ComfyUIDownload,
    ComfyUIFile,
    ComfyUIFinished,
    ComfyUISubmit,
    ComfyUISubmitted,
    ComfyUIWait,
)
from spillway.models import Downloaded, OutputFile, Progress
from spillway.settings import Settings

# One ComfyUI request; waits and downloads heartbeat meanwhile, so a slow answer is not a
# dead worker. A submit that times out is retried and finds its prompt before posting.
REQUEST_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
# Per network step, not per file: a 2 GB video may take minutes, but never 60 s of silence.
DOWNLOAD_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
OUTPUT_KINDS = ("images", "gifs", "videos")
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")

Where = Literal["pending", "running", "done", "absent"]


@dataclass(frozen=True)
class _Seen:
    where: Where
    entry: dict[str, Any] | None = None


class ComfyUIActivities:
    def __init__(
        self,
        http: httpx.AsyncClient,
        settings: Settings,
        *,
        heartbeat_every_s: float | None = None,
    ) -> None:
        self._http, self._settings = http, settings
        # Six beats per heartbeat timeout: a slow ComfyUI never looks like a dead worker.
        self._heartbeat_every_s = heartbeat_every_s or settings.SPILLWAY_HEARTBEAT_TIMEOUT_S / 6

    # --- submit ------------------------------------------------------------------------------

    @activity.defn(name="comfyui_submit")
    async def submit(self, req: ComfyUISubmit) -> ComfyUISubmitted:
        seen = await self._locate(req.prompt_id)
        if seen.where != "absent":
            # An earlier try posted it (its answer was lost): posting again would run it twice.
            activity.logger.info("prompt %s already %s in ComfyUI", req.prompt_id, seen.where)
            return ComfyUISubmitted(prompt_id=req.prompt_id, posted=False)
        body = {"prompt": req.graph, "client_id": req.client_id, "prompt_id": req.prompt_id}
        response = await self._request("POST", "/prompt", json=body)
        if response.status_code == 400:
            answer = _json_or_none(response)
            raise ApplicationError(
                _rejection(answer, req.graph),
                answer,
                type=errors.GRAPH_REJECTED,
                non_retryable=True,
            )
        answer = self._json(response, "POST /prompt")
        if answer.get("node_errors"):
            # Accepted, but the outputs with errors would silently not run: take it back out.
            await self._remove(req.prompt_id)
            message = _rejection(answer, req.graph) + " (the rest was removed from ComfyUI's queue)"
            raise ApplicationError(message, answer, type=errors.GRAPH_REJECTED, non_retryable=True)
        if answer.get("prompt_id") != req.prompt_id:
            await self._remove(str(answer.get("prompt_id")))
            raise ApplicationError(
                f"ComfyUI at {self._settings.COMFYUI_URL} ignored the prompt_id it was given "
                f"(answered {answer.get('prompt_id')!r}): without it a retry could run the job "
                "twice; use a ComfyUI that accepts a caller's prompt_id (0.3.64 does)",
                type=errors.UNSUPPORTED,
                non_retryable=True,
            )
        number = answer.get("number")
        activity.logger.info("posted prompt %s (queue number %s)", req.prompt_id, number)
        return ComfyUISubmitted(
            prompt_id=req.prompt_id,
            number=int(number) if isinstance(number, int | float) else None,
            posted=True,
        )

    async def _remove(self, prompt_id: str) -> None:
        with contextlib.suppress(ApplicationError):
            await self._request("POST", "/queue", json={"delete": [prompt_id]})
        with contextlib.suppress(ApplicationError):  # it may have started already
            await self._request("POST", "/interrupt", json={"prompt_id": prompt_id})

    # --- wait --------------------------------------------------------------------------------

    @activity.defn(name="comfyui_wait")
    async def wait(self, req: ComfyUIWait) -> ComfyUIFinished:
        watch = _Watch(req.prompt_id)
        async with self._heartbeating(watch):
            # Short prompts (and a wait resumed after a crash) are often over already: one look
            # at the history first spares the WebSocket.
            try:
                seen: _Seen | None = await self._locate(req.prompt_id)
            except ApplicationError:  # ComfyUI not answering: the poll below keeps trying
                seen = None
            if seen is not None and seen.entry is not None:
                return _finished(req.prompt_id, seen.entry)
            socket = asyncio.create_task(self._follow_socket(req, watch))
            try:
                return await self._poll_until_end(req.prompt_id, watch)
            finally:
                socket.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await socket

    async def _poll_until_end(self, prompt_id: str, watch: _Watch) -> ComfyUIFinished:
        poll_s = self._settings.COMFYUI_HISTORY_POLL_S
        absent_polls = 0
        while True:
            watch.wake.clear()
            try:
                seen: _Seen | None = await self._locate(prompt_id)
            except ApplicationError as exc:
                # No answer is not an answer: only ComfyUI saying "neither queued nor in
                # history" counts towards LOST.
                activity.logger.warning("polling prompt %s: %s", prompt_id, exc.message)
                seen = None
            if seen is not None and seen.entry is not None:
                return _finished(prompt_id, seen.entry)
            if seen is not None and seen.where == "absent":
                absent_polls += 1
                if absent_polls >= 2:
                    activity.logger.warning("prompt %s is lost (ComfyUI restarted?)", prompt_id)
                    return ComfyUIFinished(prompt_id=prompt_id, outcome="lost")
                await asyncio.sleep(poll_s)  # a second look, a full interval later
                continue
            if seen is not None:
                absent_polls = 0
                watch.observe(seen.where)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(poll_s):
                    await watch.wake.wait()

    async def _follow_socket(self, req: ComfyUIWait, watch: _Watch) -> None:
        url = re.sub(r"^http", "ws", self._settings.comfyui("/ws"))
        delay = 0.5
        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    async with session.ws_connect(
                        url, params={"clientId": req.client_id}, heartbeat=20.0
                    ) as ws:
                        delay = 0.5
                        async for message in ws:
                            if message.type == aiohttp.WSMsgType.TEXT:  # binary: previews
                                with contextlib.suppress(ValueError):
                                    watch.on_message(json.loads(message.data))
                except (aiohttp.ClientError, TimeoutError) as exc:
                    activity.logger.debug("ComfyUI socket: %r", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, max(self._settings.COMFYUI_HISTORY_POLL_S, 1.0))

    @contextlib.asynccontextmanager
    async def _heartbeating(self, watch: _Watch) -> AsyncIterator[None]:
        """Heartbeat on every change and at least every heartbeat_every_s: a wait on a prompt
        that sits in the queue for an hour must still prove its worker is alive."""

        async def beat() -> None:
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._heartbeat_every_s):
                        await watch.changed.wait()
                watch.changed.clear()
                if watch.progress is None:
                    activity.heartbeat()  # nothing known yet (ComfyUI not answering)
                else:
                    activity.heartbeat(watch.progress)

        task = asyncio.create_task(beat())
        try:
            yield
            if watch.changed.is_set() and watch.progress is not None:
                activity.heartbeat(watch.progress)  # the last word: 100 %, downloaded, ...
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # --- download ----------------------------------------------------------------------------

    @activity.defn(name="comfyui_download")
    async def download(self, req: ComfyUIDownload) -> Downloaded:
        job_dir = self._job_dir(req.job_id)
        targets = [_target(job_dir, f) for f in req.files]  # all checked before any request
        watch = _Watch(req.job_id)
        outputs = []
        async with self._heartbeating(watch):
            for file, target in zip(req.files, targets, strict=True):
                if target.is_file():
                    # Renamed into place only once complete: a re-run keeps it.
                    watch.set(Progress(phase="downloaded", node=file.filename))
                    outputs.append(await asyncio.to_thread(files.describe, target))
                else:
                    outputs.append(await self._fetch(file, target, watch))
        return Downloaded(outputs=outputs)

    def _job_dir(self, job_id: str) -> Path:
        if not _JOB_ID.match(job_id):
            raise ApplicationError(
                f"job id {job_id!r} cannot name a folder",
                type=errors.UNSAFE_PATH,
                non_retryable=True,
            )
        return (self._settings.SPILLWAY_OUTPUT_DIR / job_id).resolve()

    async def _fetch(self, file: ComfyUIFile, target: Path, watch: _Watch) -> OutputFile:
        params = {"filename": file.filename, "subfolder": file.subfolder, "type": file.type}
        try:
            async with self._http.stream(
                "GET", self._settings.comfyui("/view"), params=params, timeout=DOWNLOAD_TIMEOUT
            ) as response:
                if response.status_code in (400, 403, 404):
                    raise ApplicationError(
                        f"ComfyUI has no output {file.subfolder}/{file.filename} ({file.type}): "
                        f"/view answered {response.status_code}",
                        type=errors.OUTPUT_MISSING,
                        non_retryable=True,
                    )
                if not response.is_success:
                    raise _unavailable(f"GET /view answered {response.status_code}")
                output = await files.save(
                    response, target, lambda done, total: watch.set(_progress(file, done, total))
                )
        except files.IncompleteDownload as exc:
            raise _unavailable(f"{file.filename}: {exc}") from exc
        except httpx.HTTPError as exc:
            raise _unavailable(f"downloading {file.filename}: {_why(exc)}") from exc
        activity.logger.info("downloaded %s (%d bytes)", target, output.bytes)
        return output

    # --- cancel ------------------------------------------------------------------------------

    @activity.defn(name="comfyui_cancel")
    async def cancel(self, req: ComfyUICancel) -> ComfyUICancelled:
        watch = _Watch(req.prompt_id)
        pause = min(self._settings.COMFYUI_HISTORY_POLL_S, 1.0)
        was: Literal["pending", "running", "gone"] = "gone"
        async with self._heartbeating(watch):
            while (where := await self._queued(req.prompt_id)) is not None:
                if was == "gone":
                    was = where
                # Pending: delete it. Running: ComfyUI stops it at the next node boundary; an
                # interrupt naming a prompt_id is ignored unless that prompt is the one running,
                # so repeating it can never stop the next job.
                if where == "pending":
                    await self._request("POST", "/queue", json={"delete": [req.prompt_id]})
                else:
                    await self._request("POST", "/interrupt", json={"prompt_id": req.prompt_id})
                watch.set(Progress(phase=f"cancelling {where}"))
                await asyncio.sleep(pause)
        activity.logger.info("prompt %s was %s and is out of ComfyUI", req.prompt_id, was)
        return ComfyUICancelled(prompt_id=req.prompt_id, was=was)

    # --- reading ComfyUI ---------------------------------------------------------------------

    async def _queued(self, prompt_id: str) -> Literal["pending", "running"] | None:
        queue = self._json(await self._request("GET", "/queue"), "GET /queue")
        for where, key in (("running", "queue_running"), ("pending", "queue_pending")):
            items = queue.get(key)
            if not isinstance(items, list):
                raise _unavailable(f"GET /queue answered without a {key} list")
            if any(isinstance(i, list) and len(i) > 1 and i[1] == prompt_id for i in items):
                return "running" if where == "running" else "pending"
        return None

    async def _locate(self, prompt_id: str) -> _Seen:
        where = await self._queued(prompt_id)
        if where is not None:
            return _Seen(where)
        path = "/history/" + quote(prompt_id, safe="")
        history = self._json(await self._request("GET", path), "GET /history")
        entry = history.get(prompt_id)
        if isinstance(entry, dict):
            return _Seen("done", entry)
        return _Seen("absent")

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        url = self._settings.comfyui(path)
        try:
            response = await self._http.request(method, url, timeout=REQUEST_TIMEOUT, **kwargs)
        except httpx.HTTPError as exc:
            raise _unavailable(f"no answer from {url} ({_why(exc)})") from exc
        if response.status_code >= 500 or response.status_code in (404, 405):
            raise _unavailable(f"{method} {url} answered {response.status_code}")
        return response

    def _json(self, response: httpx.Response, what: str) -> dict[str, Any]:
        answer = _json_or_none(response)
        if not response.is_success or not isinstance(answer, dict):
            snippet = response.text[:60].replace("\n", " ")
            raise _unavailable(f"{what} answered {response.status_code} {snippet!r}")
        return answer


class _Watch:
    """What a long activity last saw, for its heartbeats; `wake` asks the poll to look now."""

    def __init__(self, prompt_id: str) -> None:
        self.prompt_id = prompt_id
        self.progress: Progress | None = None
        self.changed = asyncio.Event()
        self.wake = asyncio.Event()

    def set(self, progress: Progress) -> None:
        if progress != self.progress:
            self.progress = progress
            self.changed.set()

    def observe(self, where: Where) -> None:
        if where == "pending":
            self.set(Progress(phase="queued"))
        elif self.progress is None or self.progress.phase != "running":
            self.set(Progress(phase="running"))

    def on_message(self, message: Any) -> None:
        if not isinstance(message, dict) or not isinstance(message.get("data"), dict):
            return
        kind, data = message.get("type"), message["data"]
        # The socket carries every prompt of this client (earlier attempts included); a
        # reconnect's "executing" names no prompt but only goes to the running prompt's client.
        if data.get("prompt_id", self.prompt_id) != self.prompt_id:
            return
        if kind == "execution_start":
            self.set(Progress(phase="running"))
        elif kind == "executing" and data.get("node") is not None:
            self.set(Progress(phase="running", node=str(data["node"])))
        elif kind == "progress":
            value, maximum = data.get("value"), data.get("max")
            if isinstance(value, int | float) and isinstance(maximum, int | float) and maximum:
                self.set(
                    Progress(
                        phase="running",
                        node=None if data.get("node") is None else str(data["node"]),
                        value=int(value),
                        max=int(maximum),
                        percent=round(100 * value / maximum, 1),
                    )
                )
        elif kind == "executing" or kind in (
            "execution_success",
            "execution_error",
            "execution_interrupted",
        ):
            # `executing {node: null}` comes after ComfyUI wrote history: the safe end signal.
            self.wake.set()


def _finished(prompt_id: str, entry: dict[str, Any]) -> ComfyUIFinished:
    status = _dict(entry.get("status"))
    if status.get("status_str") == "success":
        files = files_of(_dict(entry.get("outputs")))
        return ComfyUIFinished(prompt_id=prompt_id, outcome="success", files=files)
    messages = [m for m in status.get("messages") or [] if isinstance(m, list) and len(m) == 2]
    for kind, raw in reversed(messages):
        data = _dict(raw)
        if kind == "execution_interrupted":
            raise ApplicationError(
                f"ComfyUI interrupted prompt {prompt_id} at node {data.get('node_id')} "
                f"({data.get('node_type')})",
                data,
                type=errors.INTERRUPTED,
                non_retryable=True,
            )
        if kind == "execution_error":
            message = str(data.get("exception_message", "")).strip()
            raise ApplicationError(
                f"ComfyUI failed in node {data.get('node_id')} ({data.get('node_type')}): "
                f"{data.get('exception_type')}: {message}",
                {k: data.get(k) for k in ("node_id", "node_type", "exception_type")}
                | {"exception_message": message},
                type=errors.EXECUTION_FAILED,
                non_retryable=True,
            )
    raise ApplicationError(
        f"ComfyUI ended prompt {prompt_id} with status {status.get('status_str')!r} and no error",
        type=errors.EXECUTION_FAILED,
        non_retryable=True,
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


def _rejection(answer: Any, graph: dict[str, Any]) -> str:
    """One line naming each failing node, its class and why: ComfyUI's own words."""
    answer = answer if isinstance(answer, dict) else {}
    parts = []
    for node_id, node in (answer.get("node_errors") or {}).items():
        reasons = "; ".join(
            f"{e.get('message')}: {e.get('details')}" if e.get("details") else str(e.get("message"))
            for e in node.get("errors", [])
        )
        parts.append(
            f"node {node_id} ({node.get('class_type') or _class_of(graph, node_id)}): {reasons}"
        )
    error = answer.get("error") if isinstance(answer.get("error"), dict) else None
    if not parts and error is not None:
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


def _target(job_dir: Path, file: ComfyUIFile) -> Path:
    """Where a ComfyUI output lands: <job dir>/<subfolder>/<filename>, refusing any name that
    would escape the job's folder (ComfyUI names come from the graph, which a user wrote)."""
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
    target = job_dir.joinpath(*names)
    if not target.resolve().is_relative_to(job_dir):
        raise _unsafe(file)  # a symlink inside the job folder pointing elsewhere
    return target


def _unsafe(file: ComfyUIFile) -> ApplicationError:
    return ApplicationError(
        f"refusing ComfyUI output {file.subfolder!r}/{file.filename!r}: it would be written "
        "outside the job's folder",
        type=errors.UNSAFE_PATH,
        non_retryable=True,
    )


def _progress(file: ComfyUIFile, done: int, total: int | None) -> Progress:
    percent = round(100 * done / total, 1) if total else None
    return Progress(phase="downloading", node=file.filename, value=done, max=total, percent=percent)


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _unavailable(message: str) -> ApplicationError:
    return ApplicationError(f"ComfyUI: {message}", type=errors.UNAVAILABLE)


def _why(exc: httpx.HTTPError) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
