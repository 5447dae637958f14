"""Every HTTP and WebSocket exchange with ComfyUI (docs/design.md, "ComfyUI facts"), and nothing
Temporal-specific: failures are the exceptions below, which the activities turn into
ApplicationErrors. What the answers mean is read by answers.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import aiohttp
import httpx

from activities.comfyui import answers
from activities.comfyui.answers import Queued, Seen
from activities.comfyui.capabilities import Capabilities, capabilities
from activities.comfyui.models import ComfyUIFile
from activities.http import MAYBE_SENT, why
from activities.storage.store import IncompleteDownload
from spillway.core.settings import shown

# One ComfyUI request (COMFYUI_REQUEST_TIMEOUT_S); waits and downloads heartbeat meanwhile, so
# a slow answer is not a dead worker. A submit that times out is retried and finds its prompt
# before posting.
REQUEST_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
# Per network step, not per file (COMFYUI_DOWNLOAD_TIMEOUT_S): a 2 GB video may take minutes,
# but never 60 s of silence.
DOWNLOAD_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
CONNECT_TIMEOUT_S = 5.0
SOCKET_PING_S = 20.0
REMEMBERED_POSTS = 1000
MAX_FOLDERS = 64  # model folders read (ComfyUI 0.3.64 knows 20)
MAX_LISTED = 10_000  # files kept per model folder
_log = logging.getLogger(__name__)


class ComfyUIError(Exception):
    pass


class Unavailable(ComfyUIError):
    """No answer, a 5xx, a 404/405 (not a ComfyUI, or not this version), or an answer that is
    not ComfyUI's: worth retrying. The message starts with "ComfyUI: ". `sent_at`: when the
    request that got no answer at all left (time.time()); None when something answered."""

    def __init__(self, message: str, *, sent_at: float | None = None) -> None:
        super().__init__(f"ComfyUI: {message}")
        self.sent_at = sent_at


class Unanswered(Unavailable):
    """The request may have reached ComfyUI, but no answer came back (a timeout or a dropped
    connection after sending, a proxy's 502/504): a POST /prompt may still be queued later."""


class Rejected(ComfyUIError):
    """POST /prompt answered 400: the graph is wrong, and posting it again cannot help."""

    def __init__(self, answer: Any) -> None:
        super().__init__("POST /prompt answered 400")
        self.answer = answer  # ComfyUI's JSON ({"error", "node_errors"}), None if not JSON


class UploadRefused(ComfyUIError):
    """POST /upload/image answered 400: sending the same again cannot help."""


class OutputMissing(ComfyUIError):
    """/view answered 400, 403 or 404 for an output: ComfyUI does not have (or serve) it."""


class ComfyUIClient:
    def __init__(
        self,
        http: httpx.AsyncClient,
        base_url: str,
        *,
        request_timeout: httpx.Timeout = REQUEST_TIMEOUT,
        download_timeout: httpx.Timeout = DOWNLOAD_TIMEOUT,
    ) -> None:
        self._http, self._base = http, base_url.rstrip("/")
        self._request_timeout, self._download_timeout = request_timeout, download_timeout
        self._no_jobs_api = False  # this ComfyUI has no /api/jobs/{id}/cancel
        self._posts: dict[str, datetime | None] = {}
        self._answered_at = float("-inf")

    @property
    def answered_at(self) -> float:
        """When ComfyUI last answered a request of this client (time.time()), -inf before."""
        return self._answered_at

    @property
    def posts(self) -> Mapping[str, datetime | None]:
        """This client's recent POST /prompt by prompt_id: when the last one was sent if it got
        no answer (it may still land in ComfyUI's queue), None once one was answered."""
        return self._posts

    def _note_post(self, prompt_id: str, sent: datetime | None) -> None:
        self._posts.pop(prompt_id, None)
        self._posts[prompt_id] = sent
        while len(self._posts) > REMEMBERED_POSTS:
            del self._posts[next(iter(self._posts))]  # the oldest

    # --- prompts -------------------------------------------------------------------------------

    async def post_prompt(
        self, graph: dict[str, Any], *, client_id: str, prompt_id: str, front: bool = False
    ) -> dict[str, Any]:
        """ComfyUI's answer to a queued prompt (`{"prompt_id", "number", "node_errors"}`: a partly
        valid graph is queued with non-empty node_errors). Raises Rejected on a 400. `front`:
        queued before everything pending (ComfyUI then answers a negative number)."""
        body: dict[str, Any] = {"prompt": graph, "client_id": client_id, "prompt_id": prompt_id}
        if front:
            body["front"] = True
        # Noted before sending: a POST cancelled or cut off mid-way may still be queued.
        self._note_post(prompt_id, datetime.now(UTC))
        try:
            response = await self._request("POST", "/prompt", json=body)
        except Unanswered:
            raise
        except Unavailable:
            self._note_post(prompt_id, None)  # ComfyUI answered: it will not queue it later
            raise
        self._note_post(prompt_id, None)
        if response.status_code == 400:
            raise Rejected(_json_or_none(response))
        return self._json(response, "POST /prompt")

    async def queue(self) -> dict[str, Queued]:
        """Every prompt in ComfyUI's queue and where it is (pending or running)."""
        try:
            return answers.queue_places(await self._get_json("/queue", "GET /queue"))
        except answers.MalformedAnswer as exc:
            raise Unavailable(str(exc)) from None

    async def queued(self, prompt_id: str) -> Queued | None:
        """Where the prompt is in ComfyUI's queue: running, pending, or None (not queued)."""
        return (await self.queue()).get(prompt_id)

    async def capabilities(self) -> Capabilities:
        """What this ComfyUI can run: `GET /object_info` (about 500 KB), kept as matching needs
        it (activities/comfyui/capabilities.py)."""
        answer = await self._get_json("/object_info", "GET /object_info")
        try:
            return capabilities(answer, datetime.now(UTC), await self._model_files())
        except answers.MalformedAnswer as exc:
            raise Unavailable(str(exc)) from None

    async def _model_files(self) -> dict[str, list[str]]:
        """The files of each model folder (`GET /models`, then `/models/{folder}`), for people
        to see what a host has; a folder (or all of them) that cannot be read is left out."""

        async def listed(path: str) -> list[str]:
            try:
                response = await self._request("GET", path)
            except Unavailable:
                return []
            answer = _json_or_none(response)
            ok = response.is_success and isinstance(answer, list)
            return [str(name) for name in answer][:MAX_LISTED] if ok else []

        folders = (await listed("/models"))[:MAX_FOLDERS]
        found = await asyncio.gather(*(listed("/models/" + quote(f, safe="")) for f in folders))
        return {folder: files for folder, files in zip(folders, found, strict=True) if files}

    async def history(self, prompt_id: str) -> dict[str, Any] | None:
        """The prompt's history entry; None while it is queued AND when ComfyUI never saw it."""
        path = "/history/" + quote(prompt_id, safe="")
        return answers.history_entry(await self._get_json(path, "GET /history"), prompt_id)

    async def locate(self, prompt_id: str) -> Seen:
        """Queued, done (with its history entry) or absent. /queue is read first: a prompt that
        finishes between the two reads is then seen in history, never as absent."""
        where = await self.queued(prompt_id)
        if where is not None:
            return Seen(where)
        entry = await self.history(prompt_id)
        return Seen("absent") if entry is None else Seen("done", entry)

    async def cancel_job(self, prompt_id: str) -> bool:
        """Newer ComfyUI's `POST /api/jobs/{id}/cancel` (docs/design.md, "Facts found while
        building"): True when ComfyUI accepted it. False when this ComfyUI has no such endpoint
        (0.3.64 answers 404 or 405 in plain text: remembered, never asked again) or it refused:
        the caller then takes the prompt out the old way."""
        if self._no_jobs_api:
            return False
        path = "/api/jobs/" + quote(prompt_id, safe="") + "/cancel"
        response = await self._send("POST", path)
        if response.status_code in (404, 405) and _json_or_none(response) is None:
            self._no_jobs_api = True
        return response.is_success

    async def delete_pending(self, prompt_id: str) -> None:
        """Removes a pending prompt; does nothing to a running one."""
        await self._request("POST", "/queue", json={"delete": [prompt_id]})

    async def interrupt(self, prompt_id: str) -> None:
        """Stops the prompt at its next node boundary if it is the one running; ComfyUI ignores
        an interrupt naming another prompt, so a late one can never stop the next job."""
        await self._request("POST", "/interrupt", json={"prompt_id": prompt_id})

    async def withdraw(self, prompt_id: str) -> None:
        """Best effort: takes the prompt out wherever it is (it may start between the two)."""
        for take_out in (self.delete_pending, self.interrupt):
            try:
                await take_out(prompt_id)
            except Unavailable as exc:
                _log.warning("could not take prompt %s out of ComfyUI: %s", prompt_id, exc)

    # --- outputs -------------------------------------------------------------------------------

    @asynccontextmanager
    async def view(self, file: ComfyUIFile) -> AsyncIterator[httpx.Response]:
        """One output from /view, its body not read yet: the caller streams it. Failures while
        it streams (a dropped connection, a short body) are Unavailable too."""
        params = {"filename": file.filename, "subfolder": file.subfolder, "type": file.type}
        sent_at: float | None = time.time()
        try:
            async with self._http.stream(
                "GET", self._base + "/view", params=params, timeout=self._download_timeout
            ) as response:
                sent_at = None  # answered: what fails from here on is the stream
                if response.status_code in (400, 403, 404):
                    raise OutputMissing(
                        f"ComfyUI has no output {file.subfolder}/{file.filename} ({file.type}): "
                        f"/view answered {response.status_code}"
                    )
                if not response.is_success:
                    raise Unavailable(f"GET /view answered {response.status_code}")
                self._answered_at = time.time()
                yield response
        except IncompleteDownload as exc:
            raise Unavailable(f"{file.filename}: {exc}") from exc
        except httpx.HTTPError as exc:
            message = f"downloading {file.filename}: {why(exc)}"
            raise Unavailable(message, sent_at=sent_at) from exc

    # --- inputs --------------------------------------------------------------------------------

    async def upload_image(
        self, data: bytes, name: str, mime: str, subfolder: str
    ) -> dict[str, Any]:
        """POST /upload/image with overwrite: the same name again replaces the file (a content-
        hash name makes that the same file). ComfyUI's `{"name", "subfolder", "type"}`; raises
        UploadRefused on a 400 (e.g. a subfolder outside the input folder)."""
        form = {"subfolder": subfolder, "type": "input", "overwrite": "true"}
        upload = {"image": (name, data, mime)}
        response = await self._request("POST", "/upload/image", data=form, files=upload)
        if response.status_code == 400:
            raise UploadRefused(f"ComfyUI refused the upload of {name} (400)")
        return self._json(response, "POST /upload/image")

    # --- the WebSocket -------------------------------------------------------------------------

    async def socket_messages(
        self, client_id: str, *, reconnect_max_s: float
    ) -> AsyncIterator[Any]:
        """Every JSON message of /ws for `client_id`, forever: a dropped or refused socket is
        reopened after 0.5 s, doubling up to `reconnect_max_s`. The caller ends it by cancelling.
        Binary messages (previews) and text that is not JSON are skipped."""
        url = re.sub(r"^http", "ws", self._base + "/ws")
        delay = 0.5
        async with aiohttp.ClientSession() as session:
            while True:
                try:
                    async with session.ws_connect(
                        url, params={"clientId": client_id}, heartbeat=SOCKET_PING_S
                    ) as ws:
                        delay = 0.5
                        async for message in ws:
                            if message.type != aiohttp.WSMsgType.TEXT:
                                continue
                            try:
                                decoded = json.loads(message.data)
                            except ValueError:
                                continue
                            yield decoded
                except (aiohttp.ClientError, TimeoutError) as exc:
                    _log.debug("ComfyUI socket: %r", exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, reconnect_max_s)

    # --- plumbing ------------------------------------------------------------------------------

    async def _get_json(self, path: str, what: str) -> dict[str, Any]:
        return self._json(await self._request("GET", path), what)

    async def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = await self._send(method, path, **kwargs)
        url = shown(self._base + path)
        if response.status_code in (502, 504):  # a proxy gave up; ComfyUI may still act on it
            raise Unanswered(f"{method} {url} answered {response.status_code}")
        if response.status_code >= 500 or response.status_code in (404, 405):
            raise Unavailable(f"{method} {url} answered {response.status_code}")
        self._answered_at = time.time()
        return response

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        url = self._base + path
        sent_at = time.time()
        try:
            return await self._http.request(method, url, timeout=self._request_timeout, **kwargs)
        except MAYBE_SENT as exc:
            raise Unanswered(f"no answer from {shown(url)} ({why(exc)})", sent_at=sent_at) from exc
        except httpx.HTTPError as exc:
            raise Unavailable(f"no answer from {shown(url)} ({why(exc)})", sent_at=sent_at) from exc

    @staticmethod
    def _json(response: httpx.Response, what: str) -> dict[str, Any]:
        answer = _json_or_none(response)
        if not response.is_success or not isinstance(answer, dict):
            snippet = response.text[:60].replace("\n", " ")
            raise Unavailable(f"{what} answered {response.status_code} {snippet!r}")
        return answer


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None
