"""A Kling double over real loopback HTTP, answering in the shapes of Kling's API reference
(docs/design.md, "Kling facts"); tests use it, and later `spillway dev --simulate`.

- Every API request needs `Authorization: Bearer <JWT>` signed with this account's secret key,
  iss = its access key, within nbf..exp: else HTTP 401 with code 1001 (no header), 1002 (bad
  token, signature or issuer), 1003 (not yet valid) or 1004 (expired).
- `POST /v1/videos/text2video|image2video` → `{code, message, request_id, data: {task_id,
  task_info: {external_task_id}, task_status: "submitted", created_at, updated_at}}`.
  `external_task_id` is unique per account (across both kinds): a second create with one that
  exists makes no task. Kling's reference only says the id "must be unique per user", not how a
  duplicate is refused; the double answers HTTP 400 with code 1201 ("invalid parameter"), the
  table's row for a bad value, which a client reads as ambiguous and then reconciles.
- `GET /v1/videos/{kind}/{id}`: `id` is a task id or an external_task_id (Kling's "choose one
  of the two query methods"); each query moves a task one step along its status sequence
  (default submitted → processing → succeed, the last one repeats). An unknown id answers HTTP
  404 with code 1203 ("requested resource does not exist"): Kling's answer is not documented.
- `GET /sim-videos/{video_id}.mp4`: the video, deterministic bytes, no auth (Kling's URLs are
  on a CDN); 404 for a video it never made, 410 for one `expire_videos` deleted (Kling deletes
  videos 30 days after they are made; which status its CDN answers then is not documented).

Knobs: `set_statuses`, `fail_with`, `refuse_next_creates` (1102, 1303 or any code, with its
HTTP status), `fault_next_create` ("hang" or "drop" after the task was made, or not), `release`,
`expire_videos`, `units` (a `final_unit_deduction` for finished tasks' query answers; None
leaves the field out), plus SimServer's per-path faults and `answers`. Counters:
`create_calls`, `tasks_created`, `query_hits`, `download_hits`, `auth_headers` (per path kind:
"create", "query", "download"), `create_bodies`.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Unpack

from aiohttp import web

from activities.kling.answers import CODES, TASK_NOT_FOUND, TaskStatus
from activities.kling.requests import (
    DURATIONS,
    JWT_EXPIRED,
    JWT_NOT_YET_VALID,
    PROMPT_MAX_CHARS,
    verify_jwt,
)
from spillway.sim.cloud import CloudSim, Listening
from spillway.sim.server import json_body

SIM_ACCESS_KEY = "sim-kling-access-key"
SIM_SECRET_KEY = "sim-kling-secret-key"  # noqa: S105 - the double's own, never a real key
KINDS = ("text2video", "image2video")
VIDEOS_PATH = "/sim-videos"
DEFAULT_STATUSES: tuple[TaskStatus, ...] = ("submitted", "processing", "succeed")
TASK_BASE, VIDEO_BASE = 866_889_456_698_785_000, 867_283_741_759_111_000
DUPLICATE_MSG = "external_task_id already exists"

PathKind = Literal["create", "query", "download"]


@dataclass
class SimTask:
    task_id: str
    video_id: str
    kind: str
    external_task_id: str | None
    body: dict[str, Any]
    statuses: tuple[TaskStatus, ...]
    fail_msg: str = ""
    queries: int = 0
    created_at: int = field(default_factory=lambda: int(time.time() * 1000))


@dataclass(frozen=True)
class _Script:
    statuses: tuple[TaskStatus, ...]
    fail_msg: str = ""


def _verifier(access_key: str, secret_key: str) -> Callable[[str, int], str | None]:
    # The keys live only in this closure, so no repr or dump of the double can show them.
    def verify(token: str, now: int) -> str | None:
        return verify_jwt(token, access_key, secret_key, now)

    return verify


class KlingSim(CloudSim):
    def __init__(
        self,
        *,
        access_key: str = SIM_ACCESS_KEY,
        secret_key: str = SIM_SECRET_KEY,
        clock: Callable[[], float] = time.time,
        **listening: Unpack[Listening],
    ) -> None:
        super().__init__(video_seed="spillway-kling-sim-video", **listening)
        self._verify = _verifier(access_key, secret_key)
        self.clock = clock
        self.tasks: dict[str, SimTask] = {}
        self.create_bodies: list[Any] = []
        # Every Authorization header received, per path kind ("" when there was none).
        self.auth_headers: dict[PathKind, list[str]] = {"create": [], "query": [], "download": []}
        self._script = _Script(DEFAULT_STATUSES)
        self._refusals: deque[tuple[int, str]] = deque()
        self.expired: set[str] = set()  # video ids whose URL answers 410 Gone
        self.units: str | None = None

    # --- knobs ------------------------------------------------------------------------------

    def set_statuses(self, statuses: list[TaskStatus] | tuple[TaskStatus, ...]) -> None:
        """Status sequence of tasks created from now on; the last one repeats."""
        if not statuses:
            raise ValueError("a status sequence needs at least one status")
        self._script = _Script(tuple(statuses))

    def fail_with(
        self, status_msg: str, *, after: tuple[TaskStatus, ...] = ("submitted", "processing")
    ) -> None:
        """Tasks created from now on end in `failed` with this task_status_msg."""
        self._script = _Script((*after, "failed"), status_msg)

    def refuse_next_creates(self, code: int, message: str | None = None, *, times: int = 1) -> None:
        """The next `times` creates make no task and answer this code with its HTTP status
        (1102 and 1303: 429). The JWT is still checked first, as Kling does."""
        self._refusals.extend([(code, message or CODES.get(code, (400, "error"))[1])] * times)

    def expire_videos(self) -> None:
        """Every video made so far is deleted: its URL answers 410 Gone."""
        self.expired |= {t.video_id for t in self.tasks.values()}

    # --- what tests read --------------------------------------------------------------------

    @property
    def create_calls(self) -> int:
        """Every create request received, whatever became of it (faults included)."""
        return sum(self.hits[f"POST /v1/videos/{kind}"] for kind in KINDS)

    @property
    def tasks_created(self) -> int:
        return len(self.tasks)

    @property
    def query_hits(self) -> int:
        return sum(
            n
            for key, n in self.hits.items()
            if any(key.startswith(f"GET /v1/videos/{kind}/") for kind in KINDS)
        )

    @property
    def download_hits(self) -> int:
        return sum(n for key, n in self.hits.items() if key.startswith(f"GET {VIDEOS_PATH}/"))

    def task_by_external_id(self, external_task_id: str) -> SimTask | None:
        return next(
            (t for t in self.tasks.values() if t.external_task_id == external_task_id), None
        )

    def sha256_of_task(self, task_id: str) -> str:
        return hashlib.sha256(self.video_bytes(self.tasks[task_id].video_id)).hexdigest()

    # --- the API ----------------------------------------------------------------------------

    def add_routes(self, app: web.Application) -> None:
        for kind in KINDS:
            app.router.add_post(f"/v1/videos/{kind}", self._create)
            app.router.add_get(f"/v1/videos/{kind}/{{id}}", self._query)
        app.router.add_get(VIDEOS_PATH + "/{name}", self._download)

    async def _create(self, request: web.Request) -> web.StreamResponse:
        kind = request.path.rsplit("/", 1)[-1]
        body = await json_body(request)
        self.create_bodies.append(body)
        if (denied := self._check_auth(request, "create")) is not None:
            return denied
        if self._refusals:
            return _error(*self._refusals.popleft())
        if (problem := _invalid(kind, body)) is not None:
            return _error(1201, problem)
        assert isinstance(body, dict)
        external = body.get("external_task_id") or None
        if external is not None and self.task_by_external_id(external) is not None:
            return _error(1201, DUPLICATE_MSG)
        if self._create_faults:
            return await self._leave_unanswered(
                request, lambda: self._new_task(kind, body, external)
            )
        task = self._new_task(kind, body, external)
        return _ok(_data(task, "submitted"))

    async def _query(self, request: web.Request) -> web.Response:
        kind, some_id = request.path.split("/")[3], request.match_info["id"]
        if (denied := self._check_auth(request, "query")) is not None:
            return denied
        task = self.tasks.get(some_id)
        if task is None or task.kind != kind:
            task = self.task_by_external_id(some_id)
        if task is None or task.kind != kind:
            return _error(TASK_NOT_FOUND, "task not found")
        status = task.statuses[min(task.queries, len(task.statuses) - 1)]
        task.queries += 1
        data = _data(task, status)
        if status == "succeed":
            url = f"{self.url}{VIDEOS_PATH}/{task.video_id}.mp4"
            duration = str(task.body.get("duration", "5"))
            data["task_result"] = {
                "videos": [{"id": task.video_id, "url": url, "duration": duration}]
            }
            if self.units is not None:
                data["final_unit_deduction"] = self.units
        elif status == "failed":
            data["task_status_msg"] = task.fail_msg
        return _ok(data)

    async def _download(self, request: web.Request) -> web.Response:
        self.auth_headers["download"].append(request.headers.get("Authorization", ""))
        video_id = request.match_info["name"].removesuffix(".mp4")
        if video_id in self.expired:
            return web.Response(status=410, text="Gone")
        if not any(t.video_id == video_id for t in self.tasks.values()):
            return web.Response(status=404, text="NoSuchKey")
        return web.Response(body=self.video_bytes(video_id), content_type="video/mp4")

    # --- helpers ----------------------------------------------------------------------------

    def _check_auth(self, request: web.Request, kind: PathKind) -> web.Response | None:
        header = request.headers.get("Authorization", "")
        self.auth_headers[kind].append(header)
        if not header.strip():
            return _error(1001, CODES[1001][1])
        if not header.startswith("Bearer "):
            return _error(1002, CODES[1002][1])
        why = self._verify(header.removeprefix("Bearer ").strip(), int(self.clock()))
        if why is None:
            return None
        code = {JWT_EXPIRED: 1004, JWT_NOT_YET_VALID: 1003}.get(why, 1002)
        return _error(code, CODES[code][1])

    def _new_task(self, kind: str, body: dict[str, Any], external: str | None) -> SimTask:
        n = self.first_serial + len(self.tasks) + 1
        task = SimTask(
            task_id=str(TASK_BASE + n),
            video_id=str(VIDEO_BASE + n),
            kind=kind,
            external_task_id=external,
            body=body,
            statuses=self._script.statuses,
            fail_msg=self._script.fail_msg,
        )
        self.tasks[task.task_id] = task
        return task


def _data(task: SimTask, status: TaskStatus) -> dict[str, Any]:
    return {
        "task_id": task.task_id,
        "task_info": {"external_task_id": task.external_task_id or ""},
        "task_status": status,
        "task_status_msg": "",
        "created_at": task.created_at,
        "updated_at": int(time.time() * 1000),
    }


def _ok(data: dict[str, Any]) -> web.Response:
    return web.json_response(
        {"code": 0, "message": "SUCCEED", "request_id": str(uuid.uuid4()), "data": data}
    )


def _error(code: int, message: str) -> web.Response:
    status = CODES.get(code, (400, ""))[0]
    answer = {"code": code, "message": message, "request_id": str(uuid.uuid4()), "data": None}
    return web.json_response(answer, status=status)


def _invalid(kind: str, body: Any) -> str | None:
    """Why Kling would refuse these parameters (code 1201), or None."""
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    prompt = body.get("prompt", "")
    if not isinstance(prompt, str) or len(prompt) > PROMPT_MAX_CHARS:
        return f"prompt must be a string of at most {PROMPT_MAX_CHARS} characters"
    if kind == "text2video" and not prompt.strip():
        return "prompt is required"
    if kind == "image2video" and not (body.get("image") or body.get("image_tail")):
        return "image or image_tail is required"
    if body.get("mode", "std") not in ("std", "pro"):
        return "mode must be std or pro"
    if body.get("aspect_ratio", "16:9") not in ("16:9", "9:16", "1:1"):
        return "aspect_ratio must be 16:9, 9:16 or 1:1"
    if body.get("duration", "5") not in DURATIONS:  # a string: the number 5 is refused
        return 'duration must be the string "5" or "10"'
    if not isinstance(body.get("model_name", ""), str):
        return "model_name must be a string"
    return None
