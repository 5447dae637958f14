"""The CLOUD route on MiniMax: three activities (create, poll, download) over `MiniMaxClient`.

Money invariant 2 starts here. A create is the only call that costs money and MiniMax has no
idempotency key, so the activity sends a create again only when MiniMax provably made no task
(`spillway.minimax_answers.classify_create`: nothing could be sent, or an explicit rate or
volume "no" with an empty task id). Anything else after the request may have left this machine
is ambiguous: a task, and a charge, may exist, so the activity fails non-retryable and says how
to check. It runs inside `CreateGuard` (armed now? the ledger's `begin`, the outcome settled),
and the workflow runs it with maximum_attempts=1. Polling and downloading cost nothing and may
retry freely.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.handover import unless_shutting_down
from activities.heartbeat import Heartbeat
from activities.inputs import InputUnreadable, data_url, read_input
from activities.ledger_client import Ledger
from activities.minimax_client import (
    MiniMaxClient,
    MiniMaxKeyProblem,
    MiniMaxTiming,
    MiniMaxUnavailable,
)
from activities.minimax_download import DOWNLOAD_FAILED as DOWNLOAD_FAILED
from activities.minimax_download import PERMANENT as PERMANENT
from activities.minimax_download import UNAVAILABLE as UNAVAILABLE
from activities.minimax_download import MiniMaxDownloader
from activities.spend import CreateGuard
from activities.storage import OutputStore
from activities.store_owner import OwnsOutputStore
from spillway import activity_names as names
from spillway.cloud_models import (
    CloudCreate,
    CloudCreated,
    CloudDone,
    CloudDownload,
    CloudPoll,
    CreateVerdict,
)
from spillway.inputs import FIRST_FRAME_MAX_BYTES
from spillway.minimax_answers import (
    PERMANENT_CODES,
    RATE_LIMIT_CODES,
    TRANSIENT_CODES,
    QueryAnswer,
    permanent_message,
)
from spillway.models import Downloaded, Progress
from spillway.settings import Settings

_A = TypeVar("_A", bound=BaseModel)
# Error types the workflow names in its retry policies and failure handling; PERMANENT,
# UNAVAILABLE and DOWNLOAD_FAILED, shared with the download, come from minimax_download.py.
AMBIGUOUS_CREATE = "MiniMaxAmbiguousCreate"
CREATE_GAVE_UP = "MiniMaxCreateGaveUp"
NO_KEY = "MiniMaxNoKey"
TASK_FAILED = "MiniMaxTaskFailed"


class MiniMaxActivities(OwnsOutputStore):
    def __init__(
        self,
        http: httpx.AsyncClient,
        settings: Settings,
        ledger: Ledger,
        timing: MiniMaxTiming | None = None,
        store: OutputStore | None = None,
    ) -> None:
        self._settings, self._http = settings, http
        timing = timing or MiniMaxTiming(
            heartbeat_every_s=settings.SPILLWAY_HEARTBEAT_TIMEOUT_S / 6
        )
        self._client = MiniMaxClient(http, settings, timing)
        self._guard = CreateGuard(ledger, settings)
        self._use_store(settings, store)

    # --- create: the only call that costs money -----------------------------------------

    @activity.defn(name=names.MINIMAX_CREATE)
    async def create(self, req: CloudCreate) -> CloudCreated:
        key = self._key(retryable=False)
        every = self._client.timing.heartbeat_every_s
        # Beats through the ledger's begin and settle too: a slow ledger is not a dead worker.
        async with Heartbeat(every, Progress(phase="reserving")) as hb:
            done = await self._guard.create(
                req.job_id,
                req.authorisation,
                req.simulated,
                lambda: self._send_create(req, key, hb),
            )
        verdict = done.verdict
        if verdict.outcome == "created" and verdict.task_id:
            activity.logger.info(
                "MiniMax task %s created for job %s (create requests sent: %d)",
                verdict.task_id,
                req.job_id,
                verdict.attempts,
            )
            return CloudCreated(
                task_id=verdict.task_id,
                created_at=verdict.sent_at,
                create_calls=verdict.attempts,
                settled=done.settled,
            )
        if verdict.outcome == "refused" and verdict.code in PERMANENT_CODES:
            raise ApplicationError(
                permanent_message(verdict.code, verdict.message, task_id=None),
                {"job_id": req.job_id, "code": verdict.code},
                type=PERMANENT,
                non_retryable=True,
            )
        if verdict.outcome == "refused":
            raise ApplicationError(
                verdict.message,
                {"job_id": req.job_id, "create_calls": verdict.attempts},
                type=CREATE_GAVE_UP,
                non_retryable=True,
            )
        raise self._ambiguous(req, verdict)

    async def _send_create(self, req: CloudCreate, key: str, hb: Heartbeat) -> CreateVerdict:
        """Sends the create until MiniMax answers anything but a provable "not now"."""
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
        if req.first_frame is not None:
            # Read before anything is sent: an input that cannot be read costs nothing.
            try:
                body["first_frame_image"] = await self._first_frame(req)
            except InputUnreadable as exc:
                return CreateVerdict(
                    outcome="refused",
                    attempts=0,
                    message=f"job {req.job_id}'s first frame: {exc}. Nothing was sent to "
                    "MiniMax and nothing was charged.",
                )
        t = self._client.timing
        loop = asyncio.get_running_loop()
        started, calls = loop.time(), 0
        backoff, rate_backoff = _Backoff(t.backoff_s), _Backoff(t.rate_limit_backoff_s)
        while True:
            calls += 1
            hb.update(Progress(phase="creating", value=calls), now=True)
            verdict = (await self._client.create(key, body)).model_copy(update={"attempts": calls})
            if verdict.outcome != "retry":
                return verdict
            delay = rate_backoff.next() if verdict.rate_limited else backoff.next()
            if loop.time() - started + delay > t.create_retry_budget_s:
                return verdict.model_copy(
                    update={
                        "outcome": "refused",
                        "message": f"MiniMax did not accept the create for job {req.job_id} "
                        f"after {calls} tries in {loop.time() - started:.0f}s (last: "
                        f"{verdict.message}). No task was created and nothing was charged: "
                        "every try was refused before sending or answered with an explicit "
                        "'no'. Resubmit the job later.",
                    }
                )
            activity.logger.warning(
                "MiniMax create for job %s not accepted (%s): nothing was created, "
                "trying again in %.1fs",
                req.job_id,
                verdict.message,
                delay,
            )
            hb.update(Progress(phase="create_backoff", value=calls), now=True)
            await asyncio.sleep(delay)

    async def _first_frame(self, req: CloudCreate) -> str:
        """MiniMax's first_frame_image: a data URL of the stored image, or the client's URL as
        it is. A data URL rather than a presigned one: MiniMax validates it with the create
        itself (a refusal before any task), it needs no bucket MiniMax can reach (a MinIO on an
        internal network is fine) and no URL that may expire while the task waits in line."""
        frame = req.first_frame
        assert frame is not None
        if frame.uri.startswith(("http://", "https://")) and frame.sha256 is None:
            return frame.uri
        return data_url(await read_input(self._store, self._http, frame, FIRST_FRAME_MAX_BYTES))

    def _ambiguous(self, req: CloudCreate, verdict: CreateVerdict) -> ApplicationError:
        sent = verdict.sent_at
        when = sent.strftime("%Y-%m-%d %H:%M:%S UTC") if sent else "the time of the create"
        task = f" (MiniMax named task {verdict.task_id})" if verdict.task_id else ""
        return ApplicationError(
            f"MiniMax create for job {req.job_id} is ambiguous ({verdict.message}): a charge "
            f"may exist{task}. MiniMax may have started a video task for the request sent at "
            f"{when}; check the usage and billing records in {self._client.console()} for a "
            "video generation task created around then. spillway will not create again for "
            "this job; resubmit it only if MiniMax shows no such task.",
            {
                "job_id": req.job_id,
                "attempted_at": sent.isoformat() if sent else None,
                "reason": verdict.message,
                "task_id": verdict.task_id,
            },
            type=AMBIGUOUS_CREATE,
            non_retryable=True,
        )

    # --- poll: free, retried by Temporal without limit -------------------------------------

    @activity.defn(name=names.MINIMAX_POLL)
    async def poll(self, req: CloudPoll) -> CloudDone:
        return await unless_shutting_down(self._poll(req))

    async def _poll(self, req: CloudPoll) -> CloudDone:
        key = self._key(retryable=True)
        t, base_interval = self._client.timing, self._settings.MINIMAX_POLL_INTERVAL_S
        interval, phase = base_interval, "polling"  # then MiniMax's own status words
        async with Heartbeat(t.heartbeat_every_s, Progress(phase=phase)) as hb:
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
                        type=TASK_FAILED,
                        non_retryable=True,
                    )
                if code in PERMANENT_CODES:
                    raise ApplicationError(
                        permanent_message(code, msg, task_id=req.task_id),
                        {"task_id": req.task_id, "code": code},
                        type=PERMANENT,
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
                        type=UNAVAILABLE,
                    )
                elif answer.status == "Success":
                    if answer.file_id in (None, ""):
                        raise ApplicationError(
                            f"MiniMax reports task {req.task_id} done but names no file",
                            type=UNAVAILABLE,
                        )
                    return CloudDone(
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

    @activity.defn(name=names.MINIMAX_DOWNLOAD)
    async def download(self, req: CloudDownload) -> Downloaded:
        return await unless_shutting_down(self._download(req))

    async def _download(self, req: CloudDownload) -> Downloaded:
        key = self._key(retryable=True)
        return await MiniMaxDownloader(self._client, self._store).run(req, key)

    # --- shared ---------------------------------------------------------------------------

    async def _get(
        self, what: str, path: str, params: dict[str, str], key: str, model: type[_A]
    ) -> _A:
        try:
            return await self._client.get(what, path, params, key, model)
        except MiniMaxUnavailable as exc:
            raise ApplicationError(str(exc), type=UNAVAILABLE) from None

    def _key(self, *, retryable: bool) -> str:
        # Poll and download are retryable without a key: the task exists and is paid for, so
        # a worker that has the key (or this one, fixed and restarted) may still fetch it.
        try:
            return self._client.key()
        except MiniMaxKeyProblem as exc:
            raise ApplicationError(
                f"{exc} in the worker's environment (nothing was sent to MiniMax)",
                type=NO_KEY,
                non_retryable=not retryable,
            ) from None

    def _clean(self, text: str) -> str:
        return self._client.clean(text)


class _Backoff:
    def __init__(self, delays: tuple[float, ...]) -> None:
        self._delays, self._n = delays, 0

    def next(self) -> float:
        delay = self._delays[min(self._n, len(self._delays) - 1)]
        self._n += 1
        return delay * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not security
