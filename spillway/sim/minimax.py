"""A MiniMax double over real loopback HTTP, answering in the shapes of MiniMax's public API
reference (docs/design.md, "MiniMax facts"); tests and `spillway dev --simulate` use it.

- `POST /v1/video_generation` (Bearer key) → `{task_id, base_resp}`, HTTP 200 even for errors;
  parameters MiniMax would refuse (no prompt nor first frame, an unknown model, a resolution or
  duration the model lacks) answer code 2013 and make no task.
- `GET /v1/query/video_generation?task_id=` → `{task_id, status, file_id (a string, on
  Success), video_width, video_height, base_resp}`; each query moves a task one step along its
  status sequence (default Preparing → Queueing → Processing → Success), the last one repeats.
- `GET /v1/files/retrieve?file_id=` → `{file: {file_id (an integer), bytes, filename,
  download_url}, base_resp}`; the URL is pre-signed (no key) and served by this double.

Knobs: `set_statuses`, `fail_with`, `inject` (one-shot base_resp codes on create, query or
retrieve), `fault_next_create` ("hang" or "drop" after the whole create was received, the task
made or not), `release`, `expire_next_urls`, `create_delay_s` (a slow but normal create),
`creates_held` (an event: every create answers only once it is set), plus SimServer's per-path
faults and `answers`.
Counters: `create_calls`, `create_calls_by_prompt`, `tasks_created`, `tasks_by_prompt`,
`query_hits`, `retrieve_hits`, `download_hits`, `download_auth_headers`, and `requests`
(bodies and query parameters, never the Authorization header).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Literal, Unpack

from aiohttp import web

from activities.minimax.answers import STATUS_MSGS
from spillway.core.models import MINIMAX_MODELS
from spillway.sim.cloud import CloudSim, Listening
from spillway.sim.server import json_body

CREATE_PATH = "/v1/video_generation"
QUERY_PATH = "/v1/query/video_generation"
RETRIEVE_PATH = "/v1/files/retrieve"
FILES_PATH = "/sim-files"
SIM_API_KEY = "sim-minimax-key"
# MiniMax's answer to a request without a usable Authorization header.
NO_KEY_MSG = (
    "login fail: Please carry the API secret key in the 'Authorization' field of the request header"
)
# What an object store answers for a pre-signed URL past its expiry.
EXPIRED_BODY = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
    "<Message>Request has expired</Message></Error>"
)

DEFAULT_STATUSES: tuple[str, ...] = ("Preparing", "Queueing", "Processing", "Success")
VIDEO_SIZES = {"512P": (910, 512), "720P": (1280, 720), "768P": (1366, 768), "1080P": (1920, 1080)}
TASK_BASE, FILE_BASE = 106_916_112_212_032, 205_258_526_306_433

Endpoint = Literal["create", "query", "retrieve"]
Auth = Literal["ok", "missing", "wrong", "none"]


@dataclass(frozen=True)
class Recorded:
    """One request as the double saw it; `auth` says how the key matched, never what it was."""

    endpoint: Literal["create", "query", "retrieve", "download"]
    params: dict[str, str]
    body: Any
    auth: Auth
    at: float = field(default_factory=time.monotonic)


@dataclass
class SimTask:
    task_id: str
    file_id: int
    prompt: str
    body: dict[str, Any]
    statuses: tuple[str, ...]
    fail_code: int = 0
    fail_msg: str = ""
    queries: int = 0


@dataclass(frozen=True)
class Script:
    """How tasks made from now on go: their statuses, and a Fail's base_resp."""

    statuses: tuple[str, ...]
    fail_code: int = 0
    fail_msg: str = ""


class MiniMaxSim(CloudSim):
    def __init__(
        self,
        *,
        api_key: str = SIM_API_KEY,
        filename: str = "output.mp4",
        **listening: Unpack[Listening],
    ) -> None:
        super().__init__(video_seed="spillway-sim-video", **listening)
        # Only a digest is kept, so no dump of the double can show the key.
        self._expected_auth = _digest(f"Bearer {api_key}".encode())
        self.filename = filename
        self.tasks: dict[str, SimTask] = {}
        self.requests: list[Recorded] = []
        self.create_calls_by_prompt: Counter[str] = Counter()
        self.tasks_by_prompt: Counter[str] = Counter()
        self.download_auth_headers = 0  # download requests that carried an Authorization header
        self._scripts: dict[str | None, Script] = {None: Script(DEFAULT_STATUSES)}
        self._injected: dict[Endpoint, deque[tuple[int, str, bool]]] = {
            "create": deque(),
            "query": deque(),
            "retrieve": deque(),
        }
        self.create_delay_s = 0.0  # every create answers (normally) only after this
        self.creates_held: asyncio.Event | None = None
        self._expire_next: deque[int] = deque()
        self._urls: dict[str, tuple[int, int | None]] = {}  # token -> (file_id, expired status)
        self._files: dict[int, SimTask] = {}

    # --- knobs ------------------------------------------------------------------------------

    def set_statuses(
        self, statuses: list[str] | tuple[str, ...], *, prompt: str | None = None
    ) -> None:
        """Status sequence of tasks created from now on (those of `prompt`, or all)."""
        if not statuses:
            raise ValueError("a status sequence needs at least one status")
        self._scripts[prompt] = Script(tuple(statuses))

    def fail_with(
        self,
        status_msg: str,
        *,
        status_code: int = 0,
        prompt: str | None = None,
        after: tuple[str, ...] = ("Preparing", "Processing"),
    ) -> None:
        """Tasks created from now on (of `prompt`, or all) end in `Fail` with this message."""
        self._scripts[prompt] = Script((*after, "Fail"), status_code, status_msg)

    def inject(
        self,
        endpoint: Endpoint,
        code: int,
        status_msg: str | None = None,
        *,
        times: int = 1,
        with_task: bool = False,
    ) -> None:
        """The next `times` requests to `endpoint` answer this base_resp code (HTTP 200). With
        `with_task` a create makes its task anyway and names it in the answer next to the code
        (what MiniMax has been documented to do: the charge may exist)."""
        msg = STATUS_MSGS.get(code, "error") if status_msg is None else status_msg
        self._injected[endpoint].extend([(code, msg, with_task)] * times)

    def expire_next_urls(self, count: int = 1, status: int = 403) -> None:
        """The next `count` download URLs handed out by retrieve are already expired."""
        self._expire_next.extend([status] * count)

    # --- what tests read --------------------------------------------------------------------

    @property
    def create_calls(self) -> int:
        """Every create request received, whatever became of it (faults included)."""
        return self.hits[f"POST {CREATE_PATH}"]

    @property
    def tasks_created(self) -> int:
        return len(self.tasks)

    @property
    def query_hits(self) -> int:
        return self.hits[f"GET {QUERY_PATH}"]

    @property
    def retrieve_hits(self) -> int:
        return self.hits[f"GET {RETRIEVE_PATH}"]

    @property
    def download_hits(self) -> int:
        return sum(n for k, n in self.hits.items() if k.startswith(f"GET {FILES_PATH}/"))

    @property
    def create_bodies(self) -> list[Any]:
        return [r.body for r in self.requests if r.endpoint == "create"]

    def sha256_of_task(self, task_id: str) -> str:
        return hashlib.sha256(self.video_bytes(self.tasks[task_id].file_id)).hexdigest()

    # --- the API ----------------------------------------------------------------------------

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post(CREATE_PATH, self._create)
        app.router.add_get(QUERY_PATH, self._query)
        app.router.add_get(RETRIEVE_PATH, self._retrieve)
        app.router.add_get(FILES_PATH + "/{token}", self._download)

    async def _create(self, request: web.Request) -> web.StreamResponse:
        body = await json_body(request)
        prompt = body.get("prompt") if isinstance(body, dict) else None
        prompt = prompt if isinstance(prompt, str) else ""
        self.create_calls_by_prompt[prompt] += 1
        if (denied := self._check_auth(request, "create", body)) is not None:
            return denied
        if self._create_faults:  # a body that is no JSON object makes no task
            return await self._leave_unanswered(
                request, lambda: isinstance(body, dict) and self._new_task(body, prompt)
            )
        if self.create_delay_s:
            await asyncio.sleep(self.create_delay_s)
        if self.creates_held is not None:
            await self.creates_held.wait()
        if self._injected["create"]:
            code, msg, with_task = self._injected["create"].popleft()
            made = self._new_task(body, prompt) if with_task and isinstance(body, dict) else None
            return _error(code, msg, task_id=made.task_id if made else "")
        if (problem := invalid(body)) is not None:
            return _error(2013, f"invalid params, {problem}", task_id="")
        assert isinstance(body, dict)
        task = self._new_task(body, prompt)
        return web.json_response({"task_id": task.task_id, "base_resp": ok()})

    async def _query(self, request: web.Request) -> web.Response:
        task_id = request.query.get("task_id", "")
        if (refused := self._refusal(request, "query", task_id=task_id)) is not None:
            return refused
        task = self.tasks.get(task_id)
        if task is None:
            return _error(2013, "invalid params, task_id not found", task_id=task_id)
        return web.json_response(query_answer(task))

    async def _retrieve(self, request: web.Request) -> web.Response:
        raw = request.query.get("file_id", "")
        if (refused := self._refusal(request, "retrieve")) is not None:
            return refused
        task = self._files.get(int(raw)) if raw.isdigit() else None
        if task is None:
            return _error(2013, "invalid params, file_id not found")
        token = uuid.uuid4().hex
        self._urls[token] = (
            task.file_id,
            self._expire_next.popleft() if self._expire_next else None,
        )
        file = {
            "file_id": task.file_id,
            "bytes": self.video_size,
            "created_at": int(time.time()),
            "filename": self.filename,
            "purpose": "video_generation",
            "download_url": f"{self.url}{FILES_PATH}/{token}",
        }
        return web.json_response({"file": file, "base_resp": ok()})

    async def _download(self, request: web.Request) -> web.Response:
        token = request.match_info["token"]
        self.requests.append(Recorded("download", dict(request.query), None, "none"))
        if "Authorization" in request.headers:
            self.download_auth_headers += 1
        url = self._urls.get(token)
        if url is None:
            return web.Response(status=404, text="NoSuchKey")
        file_id, expired = url
        if expired is not None:
            return web.Response(status=expired, text=EXPIRED_BODY, content_type="application/xml")
        return web.Response(body=self.video_bytes(file_id), content_type="video/mp4")

    # --- helpers ----------------------------------------------------------------------------

    def _check_auth(
        self, request: web.Request, endpoint: Endpoint, body: Any
    ) -> web.Response | None:
        header = request.headers.get("Authorization", "").encode()
        if hmac.compare_digest(_digest(header), self._expected_auth):
            auth: Auth = "ok"
        elif header.startswith(b"Bearer ") and len(header) > len(b"Bearer "):
            auth = "wrong"
        else:
            auth = "missing"
        self.requests.append(Recorded(endpoint, dict(request.query), body, auth))
        if auth == "missing":
            return _error(1004, NO_KEY_MSG, task_id="" if endpoint == "create" else None)
        if auth == "wrong":
            return _error(2049, STATUS_MSGS[2049], task_id="" if endpoint == "create" else None)
        return None

    def _refusal(
        self, request: web.Request, endpoint: Endpoint, task_id: str | None = None
    ) -> web.Response | None:
        """A query's or retrieve's answer when the key is missing or wrong, or a code was
        injected for it; None when it is to be answered."""
        if (denied := self._check_auth(request, endpoint, None)) is not None:
            return denied
        if self._injected[endpoint]:
            code, msg, _ = self._injected[endpoint].popleft()
            return _error(code, msg, task_id=task_id)
        return None

    def _new_task(self, body: dict[str, Any], prompt: str) -> SimTask:
        script = self._scripts.get(prompt, self._scripts[None])
        task = new_task(self.first_serial + len(self.tasks) + 1, body, prompt, script)
        self.tasks[task.task_id] = task
        self._files[task.file_id] = task
        self.tasks_by_prompt[prompt] += 1
        return task


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _error(code: int, msg: str, *, task_id: str | None = None) -> web.Response:
    answer: dict[str, Any] = {"base_resp": {"status_code": code, "status_msg": msg}}
    if task_id is not None:
        answer = {"task_id": task_id} | answer
    return web.json_response(answer)


def new_task(n: int, body: dict[str, Any], prompt: str, script: Script) -> SimTask:
    """The task of serial `n`, following `script`."""
    return SimTask(
        task_id=str(TASK_BASE + n),
        file_id=FILE_BASE + n,
        prompt=prompt,
        body=body,
        statuses=script.statuses,
        fail_code=script.fail_code,
        fail_msg=script.fail_msg,
    )


def query_answer(task: SimTask) -> dict[str, Any]:
    """A query's answer for `task`, which moves it one step along its statuses."""
    status = task.statuses[min(task.queries, len(task.statuses) - 1)]
    task.queries += 1
    answer: dict[str, Any] = {"task_id": task.task_id, "status": status, "base_resp": ok()}
    if status == "Success":
        width, height = VIDEO_SIZES.get(str(task.body.get("resolution")), (1366, 768))
        answer |= {"file_id": str(task.file_id), "video_width": width, "video_height": height}
    elif status == "Fail":
        answer["base_resp"] = {"status_code": task.fail_code, "status_msg": task.fail_msg}
    return answer


def ok() -> dict[str, Any]:
    return {"status_code": 0, "status_msg": STATUS_MSGS[0]}


def invalid(body: Any) -> str | None:
    """Why MiniMax would refuse these parameters (code 2013), or None."""
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    prompt, image = body.get("prompt"), body.get("first_frame_image")
    if not (isinstance(prompt, str) and prompt.strip()) and not isinstance(image, str):
        return "prompt is required"
    resolutions = MINIMAX_MODELS.get(str(body.get("model")))
    if resolutions is None:
        return f"unknown model {body.get('model')!r}"
    durations = resolutions.get(str(body.get("resolution", "768P")))
    if durations is None or body.get("duration", 6) not in durations:
        return "resolution and duration are not supported by this model"
    if not isinstance(body.get("prompt_optimizer", True), bool):
        return "prompt_optimizer must be a boolean"
    return None
