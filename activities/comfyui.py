"""The LOCAL route: submit a graph to ComfyUI once, follow it to its end, bring its files home,
and take it back out of ComfyUI when the job is cancelled (docs/design.md, "ComfyUI facts").

ComfyUI keeps its queue and history in memory and never deduplicates a prompt_id, so every
decision here is read off `/queue` (first) and `/history/{id}` (second): a prompt finishing
between the two reads is then seen in history, never as missing. The WebSocket only brings
progress and wakes the poll early; the poll alone decides how a prompt ended.

activities/comfyui_client.py talks to ComfyUI and spillway/comfyui_answers.py reads what it
says; this module decides, heartbeats, and names failures for the workflow's retry policies.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import files
from activities.comfyui_client import ComfyUIClient, OutputMissing, Rejected, Unavailable
from activities.handover import unless_shutting_down
from activities.heartbeat import Heartbeat
from spillway import activity_names as names
from spillway.comfyui_answers import (
    PromptFailed,
    Seen,
    UnsafePath,
    Where,
    job_folder,
    outcome_of,
    output_path,
    rejection_message,
    socket_news,
)
from spillway.comfyui_models import (
    GRAPH_REJECTED,
    OUTPUT_MISSING,
    UNAVAILABLE,
    UNSAFE_PATH,
    UNSUPPORTED,
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


class ComfyUIActivities:
    def __init__(
        self,
        http: httpx.AsyncClient,
        settings: Settings,
        *,
        heartbeat_every_s: float | None = None,
    ) -> None:
        self._settings = settings
        self._client = ComfyUIClient(http, str(settings.COMFYUI_URL))
        # Six beats per heartbeat timeout: a slow ComfyUI never looks like a dead worker.
        self._heartbeat_every_s = heartbeat_every_s or settings.SPILLWAY_HEARTBEAT_TIMEOUT_S / 6

    # --- submit ------------------------------------------------------------------------------

    @activity.defn(name=names.COMFYUI_SUBMIT)
    async def submit(self, req: ComfyUISubmit) -> ComfyUISubmitted:
        with _activity_errors():
            seen = await self._client.locate(req.prompt_id)
            if seen.where != "absent":
                # An earlier try posted it (its answer was lost): posting again would run it twice.
                activity.logger.info("prompt %s already %s in ComfyUI", req.prompt_id, seen.where)
                return ComfyUISubmitted(prompt_id=req.prompt_id, posted=False)
            try:
                answer = await self._client.post_prompt(
                    req.graph, client_id=req.client_id, prompt_id=req.prompt_id
                )
            except Rejected as exc:
                raise ApplicationError(
                    rejection_message(exc.answer, req.graph),
                    exc.answer,
                    type=GRAPH_REJECTED,
                    non_retryable=True,
                ) from None
            if answer.get("node_errors"):
                # Accepted, but the outputs with errors would silently not run: take it back out.
                await self._client.withdraw(req.prompt_id)
                message = (
                    rejection_message(answer, req.graph)
                    + " (the rest was removed from ComfyUI's queue)"
                )
                raise ApplicationError(message, answer, type=GRAPH_REJECTED, non_retryable=True)
            if answer.get("prompt_id") != req.prompt_id:
                await self._client.withdraw(str(answer.get("prompt_id")))
                raise ApplicationError(
                    f"ComfyUI at {self._settings.COMFYUI_URL} ignored the prompt_id it was given "
                    f"(answered {answer.get('prompt_id')!r}): without it a retry could run the "
                    "job twice; use a ComfyUI that accepts a caller's prompt_id (0.3.64 does)",
                    type=UNSUPPORTED,
                    non_retryable=True,
                )
        number = answer.get("number")
        activity.logger.info("posted prompt %s (queue number %s)", req.prompt_id, number)
        return ComfyUISubmitted(
            prompt_id=req.prompt_id,
            number=int(number) if isinstance(number, int | float) else None,
            posted=True,
        )

    # --- wait --------------------------------------------------------------------------------

    @activity.defn(name=names.COMFYUI_WAIT)
    async def wait(self, req: ComfyUIWait) -> ComfyUIFinished:
        return await unless_shutting_down(self._wait(req))

    async def _wait(self, req: ComfyUIWait) -> ComfyUIFinished:
        # Nothing known yet: beats without details until ComfyUI says where the prompt is.
        async with Heartbeat(self._heartbeat_every_s) as heartbeat:
            watch = _Watch(req.prompt_id, heartbeat)
            # Short prompts (and a wait resumed after a crash) are often over already: one look
            # at the history first spares the WebSocket.
            try:
                seen: Seen | None = await self._client.locate(req.prompt_id)
            except Unavailable:  # ComfyUI not answering: the poll below keeps trying
                seen = None
            if seen is not None and seen.entry is not None:
                return _finished(req.prompt_id, seen.entry)
            socket = asyncio.create_task(self._follow_socket(req.client_id, watch))
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
                seen: Seen | None = await self._client.locate(prompt_id)
            except Unavailable as exc:
                # No answer is not an answer: only ComfyUI saying "neither queued nor in
                # history" counts towards LOST.
                activity.logger.warning("polling prompt %s: %s", prompt_id, exc)
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

    async def _follow_socket(self, client_id: str, watch: _Watch) -> None:
        reconnect_max_s = max(self._settings.COMFYUI_HISTORY_POLL_S, 1.0)
        async for message in self._client.socket_messages(
            client_id, reconnect_max_s=reconnect_max_s
        ):
            watch.on_message(message)

    # --- download ----------------------------------------------------------------------------

    @activity.defn(name=names.COMFYUI_DOWNLOAD)
    async def download(self, req: ComfyUIDownload) -> Downloaded:
        return await unless_shutting_down(self._download(req))

    async def _download(self, req: ComfyUIDownload) -> Downloaded:
        outputs = []
        with _activity_errors():
            job_dir = job_folder(self._settings.SPILLWAY_OUTPUT_DIR, req.job_id)
            targets = [output_path(job_dir, f) for f in req.files]  # all checked before any request
            async with Heartbeat(self._heartbeat_every_s) as heartbeat:
                for file, target in zip(req.files, targets, strict=True):
                    if target.is_file():
                        # Renamed into place only once complete: a re-run keeps it.
                        _show(heartbeat, Progress(phase="downloaded", node=file.filename))
                        outputs.append(await asyncio.to_thread(files.describe, target))
                    else:
                        outputs.append(await self._fetch(file, target, heartbeat))
        return Downloaded(outputs=outputs)

    async def _fetch(self, file: ComfyUIFile, target: Path, heartbeat: Heartbeat) -> OutputFile:
        def progress(done: int, total: int | None) -> None:
            _show(heartbeat, _download_progress(file, done, total))

        output = await self._client.download(file, target, progress)
        activity.logger.info("downloaded %s (%d bytes)", target, output.bytes)
        return output

    # --- cancel ------------------------------------------------------------------------------

    @activity.defn(name=names.COMFYUI_CANCEL)
    async def cancel(self, req: ComfyUICancel) -> ComfyUICancelled:
        pause = min(self._settings.COMFYUI_HISTORY_POLL_S, 1.0)
        was: Literal["pending", "running", "gone"] = "gone"
        with _activity_errors():
            async with Heartbeat(self._heartbeat_every_s) as heartbeat:
                while (where := await self._client.queued(req.prompt_id)) is not None:
                    if was == "gone":
                        was = where
                    # Pending: delete it. Running: ComfyUI stops it at the next node boundary; an
                    # interrupt naming a prompt_id is ignored unless that prompt is the one
                    # running, so repeating it can never stop the next job.
                    if where == "pending":
                        await self._client.delete_pending(req.prompt_id)
                    else:
                        await self._client.interrupt(req.prompt_id)
                    _show(heartbeat, Progress(phase=f"cancelling {where}"))
                    await asyncio.sleep(pause)
        activity.logger.info("prompt %s was %s and is out of ComfyUI", req.prompt_id, was)
        return ComfyUICancelled(prompt_id=req.prompt_id, was=was)


class _Watch:
    """What a wait last saw, shown in its heartbeats; `wake` asks the poll to look now."""

    def __init__(self, prompt_id: str, heartbeat: Heartbeat) -> None:
        self.prompt_id, self._heartbeat = prompt_id, heartbeat
        self.wake = asyncio.Event()

    def observe(self, where: Where) -> None:
        if where == "pending":
            _show(self._heartbeat, Progress(phase="queued"))
        elif self._heartbeat.details is None or self._heartbeat.details.phase != "running":
            # "running" with a node or a percentage from the socket says more: keep it.
            _show(self._heartbeat, Progress(phase="running"))

    def on_message(self, message: Any) -> None:
        news = socket_news(message, self.prompt_id)
        if isinstance(news, Progress):
            _show(self._heartbeat, news)
        elif news == "ended":
            self.wake.set()


def _show(heartbeat: Heartbeat, progress: Progress) -> None:
    # A change is beaten at once, since a person follows it in the UI; the same details again
    # wait for the regular beat.
    if progress != heartbeat.details:
        heartbeat.update(progress, now=True)


def _finished(prompt_id: str, entry: dict[str, Any]) -> ComfyUIFinished:
    outcome = outcome_of(prompt_id, entry)
    if isinstance(outcome, PromptFailed):
        details = () if outcome.details is None else (outcome.details,)
        raise ApplicationError(
            outcome.message, *details, type=outcome.error_type, non_retryable=True
        )
    return outcome


@contextlib.contextmanager
def _activity_errors() -> Iterator[None]:
    """The client's and the answers' exceptions as the ApplicationError types retry policies
    name. The cause stays what explains them (httpx's error, a short download), not our wrapper."""
    try:
        yield
    except Unavailable as exc:
        raise ApplicationError(str(exc), type=UNAVAILABLE) from exc.__cause__
    except OutputMissing as exc:
        raise ApplicationError(str(exc), type=OUTPUT_MISSING, non_retryable=True) from None
    except UnsafePath as exc:
        raise ApplicationError(str(exc), type=UNSAFE_PATH, non_retryable=True) from None


def _download_progress(file: ComfyUIFile, done: int, total: int | None) -> Progress:
    percent = round(100 * done / total, 1) if total else None
    return Progress(phase="downloading", node=file.filename, value=done, max=total, percent=percent)
