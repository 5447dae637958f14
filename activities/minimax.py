"""The CLOUD route: MiniMax video as three activities (create, poll, download).

Money invariant 2 starts here. A create is the only call that costs money and MiniMax has no
idempotency key, so the activity retries a create only when MiniMax provably made no task: no
connection could be opened (nothing was sent) or MiniMax answered an explicit transient "no".
Anything else after the request may have left this machine (no answer in time, a dropped
connection, a 5xx, an answer that is not MiniMax's) is AMBIGUOUS: a task, and a charge, may
exist, so the activity fails non-retryable and says how to check. The workflow runs it with
maximum_attempts=1 as well. Polling and downloading cost nothing and may retry freely.

Money invariant 3: the key comes from the worker's settings inside each activity and goes only
into the Authorization header of requests to MINIMAX_BASE_URL (never to the file host that serves
the video); every message built from a server's text or an exception is scrubbed of it.
"""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import files
from spillway.minimax_models import (
    PERMANENT_CODES,
    RATE_LIMIT_CODES,
    TRANSIENT_CODES,
    CreateAnswer,
    FileInfo,
    MiniMaxCreate,
    MiniMaxCreated,
    MiniMaxDone,
    MiniMaxDownload,
    MiniMaxPoll,
    QueryAnswer,
    RetrieveAnswer,
    permanent_message,
)
from spillway.models import Downloaded, OutputFile, Progress
from spillway.settings import Settings

# What an expired pre-signed download URL answers (object stores use 403; some CDNs 404/410).
EXPIRED_URL_STATUSES = frozenset({401, 403, 404, 410})
# Raised before a single byte of the request left this machine: safe to send again.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_HEADER_SAFE = re.compile(r"[\x21-\x7e]+")
VIDEO_EXTENSIONS = frozenset({".mp4", ".mov", ".webm", ".mkv"})


@dataclass(frozen=True)
class MiniMaxTiming:
    """How long the activities wait. Production keeps the defaults; tests shrink them."""

    heartbeat_every_s: float = 5.0  # well inside the workflow's 30 s heartbeat timeout
    connect_timeout_s: float = 10.0
    request_timeout_s: float = 20.0  # query, retrieve, and each read of a download
    # Retries of a create stop being started after this; with the last request (at most
    # MINIMAX_CREATE_TIMEOUT_S + connect) the activity ends within ~5 minutes.
    create_retry_budget_s: float = 210.0
    backoff_s: tuple[float, ...] = (2.0, 5.0, 10.0, 20.0, 30.0)  # the last one repeats
    # MiniMax allows a few video requests a minute: a rate limit waits much longer.
    rate_limit_backoff_s: tuple[float, ...] = (15.0, 30.0, 60.0)
    poll_backoff_max_s: float = 120.0
    url_refreshes: int = 3  # retrieve calls for fresh download URLs after the first expires


_A = TypeVar("_A", bound=BaseModel)


class _Heartbeat:
    """Heartbeats in the background while a request or a backoff is under way, so a slow
    MiniMax never looks like a dead worker and a dead worker is noticed within the timeout."""

    def __init__(self, every_s: float, details: Progress) -> None:
        self.details, self._every = details, every_s
        self._task: asyncio.Task[None] | None = None

    def update(self, details: Progress, *, now: bool = False) -> None:
        self.details = details
        if now:
            activity.heartbeat(details)

    async def _beat(self) -> None:
        while True:
            activity.heartbeat(self.details)
            await asyncio.sleep(self._every)

    async def __aenter__(self) -> Self:
        self._task = asyncio.create_task(self._beat())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task})


class MiniMaxActivities:
    def __init__(
        self, http: httpx.AsyncClient, settings: Settings, timing: MiniMaxTiming | None = None
    ) -> None:
        self._http, self._settings = http, settings
        self._timing = timing or MiniMaxTiming(
            heartbeat_every_s=settings.SPILLWAY_HEARTBEAT_TIMEOUT_S / 6
        )
        self._base = str(settings.MINIMAX_BASE_URL).rstrip("/")

    # --- create: the only call that costs money -----------------------------------------

    @activity.defn(name="minimax_create")
    async def create(self, req: MiniMaxCreate) -> MiniMaxCreated:
        key = self._key(retryable=False)
        cloud = req.request
        body: dict[str, Any] = {
            "model": cloud.model,
            "prompt": cloud.prompt,
            "duration": cloud.duration,
            "resolution": cloud.resolution,
            "prompt_optimizer": cloud.prompt_optimizer,
        }
        if cloud.first_frame_image is not None:
            body["first_frame_image"] = cloud.first_frame_image
        t = self._timing
        loop = asyncio.get_running_loop()
        started = loop.time()
        calls = 0
        backoff = _Backoff(t.backoff_s)
        rate_backoff = _Backoff(t.rate_limit_backoff_s)
        async with _Heartbeat(t.heartbeat_every_s, Progress(phase="creating")) as hb:
            while True:
                calls += 1
                hb.update(Progress(phase="creating", value=calls))
                sent_at = datetime.now(UTC)
                try:
                    response = await self._post_create(key, body)
                except NOT_SENT as exc:
                    why, rate_limited = f"could not connect ({_why(exc)})", False
                except asyncio.CancelledError:
                    # Worker shutdown or a cancelled job with the request in flight: report it
                    # as what it is instead of leaving the workflow to guess.
                    raise self._ambiguous(
                        req, sent_at, "the activity was cancelled while the request was in flight"
                    ) from None
                except (httpx.HTTPError, TimeoutError) as exc:
                    raise self._ambiguous(req, sent_at, self._ambiguous_reason(exc)) from None
                else:
                    answer = self._read_create(response, req, sent_at)
                    code = answer.base_resp.status_code
                    msg = self._clean(answer.base_resp.status_msg)
                    if code == 0:
                        if not answer.task_id:
                            raise self._ambiguous(
                                req, sent_at, "MiniMax answered success without a task id"
                            )
                        activity.logger.info(
                            "MiniMax task %s created for job %s (create requests sent: %d)",
                            answer.task_id,
                            req.job_id,
                            calls,
                        )
                        return MiniMaxCreated(
                            task_id=answer.task_id, created_at=sent_at, create_calls=calls
                        )
                    if code not in TRANSIENT_CODES:
                        raise ApplicationError(
                            permanent_message(code, msg, task_id=None),
                            {"job_id": req.job_id, "code": code},
                            type="MiniMaxPermanent",
                            non_retryable=True,
                        )
                    why = f"MiniMax answered code {code} ({msg})"
                    rate_limited = code in RATE_LIMIT_CODES
                delay = rate_backoff.next() if rate_limited else backoff.next()
                if loop.time() - started + delay > t.create_retry_budget_s:
                    raise ApplicationError(
                        f"MiniMax did not accept the create for job {req.job_id} after {calls} "
                        f"tries in {loop.time() - started:.0f}s (last: {why}). No task was "
                        "created and nothing was charged: every try was refused before sending "
                        "or answered with an explicit 'no'. Resubmit the job later.",
                        {"job_id": req.job_id, "create_calls": calls, "last": why},
                        type="MiniMaxCreateGaveUp",
                        non_retryable=True,
                    )
                activity.logger.warning(
                    "MiniMax create for job %s not accepted (%s): nothing was created, "
                    "trying again in %.1fs",
                    req.job_id,
                    why,
                    delay,
                )
                hb.update(Progress(phase="create_backoff", value=calls), now=True)
                await asyncio.sleep(delay)

    async def _post_create(self, key: str, body: dict[str, Any]) -> httpx.Response:
        t = self._timing
        answer_s = self._settings.MINIMAX_CREATE_TIMEOUT_S
        timeout = httpx.Timeout(answer_s, connect=t.connect_timeout_s, pool=t.connect_timeout_s)
        # httpx bounds each network step; this bounds the whole exchange (a trickled answer).
        # It cannot fire before the connection exists, so a TimeoutError here is ambiguous.
        async with asyncio.timeout(t.connect_timeout_s * 2 + answer_s):
            return await self._http.post(
                f"{self._base}/v1/video_generation", json=body, headers=_auth(key), timeout=timeout
            )

    def _read_create(
        self, response: httpx.Response, req: MiniMaxCreate, sent_at: datetime
    ) -> CreateAnswer:
        status = response.status_code
        if status >= 500:
            raise self._ambiguous(req, sent_at, f"MiniMax answered HTTP {status}")
        try:
            answer = CreateAnswer.model_validate(response.json())
        except (ValueError, ValidationError):
            raise self._ambiguous(
                req, sent_at, f"MiniMax's answer (HTTP {status}) is not a MiniMax answer"
            ) from None
        # Outside 2xx only an explicit error code is a clear "no"; MiniMax itself answers 200.
        if not response.is_success and answer.base_resp.status_code == 0:
            raise self._ambiguous(req, sent_at, f"MiniMax answered HTTP {status}")
        return answer

    def _ambiguous_reason(self, exc: BaseException) -> str:
        if isinstance(exc, httpx.WriteTimeout):
            return "sending the request timed out part-way"
        if isinstance(exc, httpx.TimeoutException | TimeoutError):
            limit = self._settings.MINIMAX_CREATE_TIMEOUT_S
            return f"no answer within {limit:g}s after the request was sent"
        return f"the connection failed after the request was sent ({self._clean(_why(exc))})"

    def _ambiguous(self, req: MiniMaxCreate, sent_at: datetime, why: str) -> ApplicationError:
        when = sent_at.strftime("%Y-%m-%d %H:%M:%S UTC")
        return ApplicationError(
            f"MiniMax create for job {req.job_id} is ambiguous ({why}): a charge may exist. "
            f"MiniMax may have started a video task for the request sent at {when}; check the "
            f"usage and billing records in {_console(self._base)} for a video generation "
            "task created around then. spillway will not create again for this job; resubmit "
            "it only if MiniMax shows no such task.",
            {"job_id": req.job_id, "attempted_at": sent_at.isoformat(), "reason": why},
            type="MiniMaxAmbiguousCreate",
            non_retryable=True,
        )

    # --- poll: free, retried by Temporal without limit -------------------------------------

    @activity.defn(name="minimax_poll")
    async def poll(self, req: MiniMaxPoll) -> MiniMaxDone:
        key = self._key(retryable=True)
        t, base_interval = self._timing, self._settings.MINIMAX_POLL_INTERVAL_S
        interval, phase = base_interval, "polling"  # then MiniMax's own status words
        async with _Heartbeat(t.heartbeat_every_s, Progress(phase=phase)) as hb:
            while True:
                answer = await self._get(
                    "query",
                    "/v1/query/video_generation",
                    {"task_id": req.task_id},
                    key,
                    QueryAnswer,
                )
                code, msg = answer.base_resp.status_code, self._clean(answer.base_resp.status_msg)
                if answer.status == "Fail":
                    detail = f"{msg} (code {code})" if code else msg or "no reason given"
                    raise ApplicationError(
                        f"MiniMax task {req.task_id} of job {req.job_id} failed: {detail}",
                        {"task_id": req.task_id, "code": code, "status_msg": msg},
                        type="MiniMaxTaskFailed",
                        non_retryable=True,
                    )
                if code in PERMANENT_CODES:
                    raise ApplicationError(
                        permanent_message(code, msg, task_id=req.task_id),
                        {"task_id": req.task_id, "code": code},
                        type="MiniMaxPermanent",
                        non_retryable=True,
                    )
                if code in RATE_LIMIT_CODES:
                    interval = min(interval * 2, max(t.poll_backoff_max_s, base_interval))
                    activity.logger.warning(
                        "MiniMax rate limit (code %d) polling task %s: next query in %.1fs",
                        code,
                        req.task_id,
                        interval,
                    )
                elif code in TRANSIENT_CODES:
                    interval = base_interval
                elif code != 0:
                    raise ApplicationError(
                        f"MiniMax answered code {code} ({msg}) polling task {req.task_id}",
                        type="MiniMaxUnavailable",
                    )
                elif answer.status == "Success":
                    if answer.file_id in (None, ""):
                        raise ApplicationError(
                            f"MiniMax reports task {req.task_id} done but names no file",
                            type="MiniMaxUnavailable",
                        )
                    return MiniMaxDone(
                        task_id=req.task_id,
                        file_id=str(answer.file_id),
                        video_width=answer.video_width,
                        video_height=answer.video_height,
                    )
                else:
                    interval, phase = base_interval, answer.status or phase
                    hb.update(Progress(phase=phase), now=True)
                await asyncio.sleep(interval)

    # --- download: free; a re-run never fetches a finished file again ---------------------

    @activity.defn(name="minimax_download")
    async def download(self, req: MiniMaxDownload) -> Downloaded:
        key = self._key(retryable=True)
        job_dir = (self._settings.SPILLWAY_OUTPUT_DIR / req.job_id).resolve()
        stem = f"minimax-{re.sub(r'[^A-Za-z0-9_-]', '_', req.task_id)[:64]}"
        if done := sorted(p for p in job_dir.glob(f"{stem}.*") if not p.name.endswith(".part")):
            return Downloaded(outputs=[await asyncio.to_thread(files.describe, done[0])])
        t = self._timing
        async with _Heartbeat(t.heartbeat_every_s, Progress(phase="retrieving")) as hb:
            for _ in range(t.url_refreshes + 1):
                params = {"file_id": req.file_id}
                answer = await self._get(
                    "retrieve", "/v1/files/retrieve", params, key, RetrieveAnswer
                )
                code, msg = answer.base_resp.status_code, self._clean(answer.base_resp.status_msg)
                if code in PERMANENT_CODES:
                    raise ApplicationError(
                        permanent_message(code, msg, task_id=req.task_id),
                        {"task_id": req.task_id, "file_id": req.file_id, "code": code},
                        type="MiniMaxPermanent",
                        non_retryable=True,
                    )
                if code != 0 or answer.file is None:
                    raise ApplicationError(
                        f"MiniMax answered code {code} ({msg}) retrieving file {req.file_id} "
                        f"of task {req.task_id}",
                        type="MiniMaxUnavailable",
                    )
                target = job_dir / (stem + _extension(answer.file.filename))
                if target.parent != job_dir:
                    raise ApplicationError(
                        f"refusing to write outside {job_dir}", non_retryable=True
                    )
                output = await self._fetch(answer.file, target, hb)
                if output is not None:
                    activity.logger.info(
                        "MiniMax video of job %s saved: %s (%d bytes)",
                        req.job_id,
                        output.path,
                        output.bytes,
                    )
                    return Downloaded(outputs=[output])
                activity.logger.info(
                    "MiniMax download URL for file %s has expired: retrieving a new one",
                    req.file_id,
                )
        raise ApplicationError(
            f"MiniMax's download URLs for file {req.file_id} kept expiring "
            f"({t.url_refreshes + 1} tries); retrying later",
            type="MiniMaxDownloadFailed",
        )

    async def _fetch(self, file: FileInfo, target: Path, hb: _Heartbeat) -> OutputFile | None:
        """The video into `target`; None when the URL has expired. The key is not sent: the
        URL is pre-signed and often on another host."""
        t = self._timing
        timeout = httpx.Timeout(t.request_timeout_s, connect=t.connect_timeout_s)

        def progress(done: int, total: int | None) -> None:
            percent = round(100 * done / total, 1) if total else None
            hb.update(Progress(phase="downloading", value=done, max=total, percent=percent))

        try:
            async with self._http.stream("GET", file.download_url, timeout=timeout) as response:
                if response.status_code in EXPIRED_URL_STATUSES:
                    return None
                if not response.is_success:
                    raise ApplicationError(
                        f"the MiniMax file host answered HTTP {response.status_code}",
                        type="MiniMaxDownloadFailed",
                    )
                # MiniMax may announce 0 bytes; then the host's Content-Length is the check.
                output = await files.save(response, target, progress, file.bytes or None)
        except files.IncompleteDownload as exc:
            raise ApplicationError(
                f"download of file {file.file_id}: {exc}", type="MiniMaxDownloadFailed"
            ) from None
        except httpx.HTTPError as exc:
            raise ApplicationError(
                f"downloading MiniMax file {file.file_id} failed ({self._clean(_why(exc))})",
                type="MiniMaxDownloadFailed",
            ) from None
        hb.update(hb.details, now=True)
        return output

    # --- shared ---------------------------------------------------------------------------

    async def _get(
        self, what: str, path: str, params: dict[str, str], key: str, model: type[_A]
    ) -> _A:
        """GET a free MiniMax endpoint; every failure is a retryable error (Temporal retries)."""
        t = self._timing
        timeout = httpx.Timeout(t.request_timeout_s, connect=t.connect_timeout_s)
        url = f"{self._base}{path}"
        try:
            async with asyncio.timeout(t.connect_timeout_s + t.request_timeout_s * 2):
                response = await self._http.get(
                    url, params=params, headers=_auth(key), timeout=timeout
                )
        except (httpx.HTTPError, TimeoutError) as exc:
            raise ApplicationError(
                f"MiniMax {what} got no answer from {url} ({self._clean(_why(exc))})",
                type="MiniMaxUnavailable",
            ) from None
        if not response.is_success:
            raise ApplicationError(
                f"MiniMax {what} answered HTTP {response.status_code}", type="MiniMaxUnavailable"
            )
        try:
            return model.model_validate(response.json())
        except (ValueError, ValidationError):
            snippet = self._clean(response.text[:60].replace("\n", " "))
            raise ApplicationError(
                f"MiniMax {what} answer is not MiniMax's ({snippet!r})", type="MiniMaxUnavailable"
            ) from None

    def _key(self, *, retryable: bool) -> str:
        # Poll and download are retryable without a key: the task exists and is paid for, so
        # a worker that has the key (or this one, fixed and restarted) may still fetch it.
        secret = self._settings.MINIMAX_API_KEY
        key = secret.get_secret_value().strip() if secret is not None else ""
        if not key:
            problem = "no MiniMax API key on this worker: set MINIMAX_API_KEY"
        elif not _HEADER_SAFE.fullmatch(key):
            # h11 would put the whole header, key included, into its error message.
            problem = "MINIMAX_API_KEY holds characters an HTTP header cannot carry: fix it"
        else:
            return key
        raise ApplicationError(
            f"{problem} in the worker's environment (nothing was sent to MiniMax)",
            type="MiniMaxNoKey",
            non_retryable=not retryable,
        )

    def _clean(self, text: str) -> str:
        """A server's text or an exception's message, never with the key in it."""
        secret = self._settings.MINIMAX_API_KEY
        key = secret.get_secret_value().strip() if secret is not None else ""
        text = text if len(text) <= 300 else text[:297] + "..."
        # A key too short to be real would garble every message it happens to occur in.
        return text.replace(key, "[MINIMAX_API_KEY]") if len(key) >= 6 else text


class _Backoff:
    def __init__(self, delays: tuple[float, ...]) -> None:
        self._delays, self._n = delays, 0

    def next(self) -> float:
        delay = self._delays[min(self._n, len(self._delays) - 1)]
        self._n += 1
        return delay * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not security


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _why(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _console(base: str) -> str:
    host = urlsplit(base).hostname or ""
    if host.startswith("api."):
        return f"the MiniMax console (https://platform.{host[4:]})"
    return f"the console of the MiniMax account behind {base}"


def _extension(filename: str) -> str:
    # Only a known video extension survives from MiniMax's filename: the name itself is ours,
    # so no '../', absolute path or odd suffix in it can reach the disk.
    ext = PurePosixPath(filename.replace("\\", "/")).suffix.lower()
    return ext if ext in VIDEO_EXTENSIONS else ".mp4"
