"""The CLOUD route on MiniMax: three activities (create, poll, download) over `MiniMaxClient`.

Money invariant 2 starts here. A create is the only call that costs money and MiniMax has no
idempotency key, so the activity sends a create again only when MiniMax provably made no task
(`answers.classify_create`: nothing could be sent, or an explicit rate or
volume "no" with an empty task id). Anything else after the request may have left this machine
is ambiguous: a task, and a charge, may exist, so the activity fails non-retryable and says how
to check. It runs inside `CreateGuard` (armed now? the ledger's `begin`, the outcome settled),
and the workflow runs it with maximum_attempts=1. Polling and downloading cost nothing and may
retry freely.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TypeVar

from pydantic import BaseModel
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.cloud import provider as cloud_create
from activities.cloud.models import CloudCreate, CloudCreated, CloudDone, CloudDownload, CloudPoll
from activities.cloud.provider import CloudActivities, CloudProvider
from activities.heartbeat import Heartbeat, unless_shutting_down
from activities.minimax.answers import (
    PERMANENT_CODES,
    RATE_LIMIT_CODES,
    TRANSIENT_CODES,
    QueryAnswer,
    permanent_message,
)
from activities.minimax.client import (
    MiniMaxClient,
    MiniMaxKeyProblem,
    MiniMaxTiming,
    MiniMaxUnavailable,
)
from activities.minimax.create import MiniMaxCreator
from activities.minimax.download import MiniMaxDownloader
from activities.minimax.errors import (
    CREATE_GAVE_UP,
    NO_KEY,
    PERMANENT,
    TASK_FAILED,
    UNAVAILABLE,
)
from spillway.core.models import CloudRequest, Downloaded, Progress
from spillway.core.settings import Settings

_A = TypeVar("_A", bound=BaseModel)
# The activities' names: on the wire, in every job's history.
CREATE = "minimax_create"
POLL = "minimax_poll"
DOWNLOAD = "minimax_download"


class MiniMaxActivities(CloudActivities[MiniMaxTiming]):
    def _default_timing(self, heartbeat_every_s: float) -> MiniMaxTiming:
        return MiniMaxTiming(heartbeat_every_s=heartbeat_every_s)

    @functools.cached_property
    def _client(self) -> MiniMaxClient:
        return MiniMaxClient(self._http, self._settings, self._timing)

    # --- create: the only call that costs money -----------------------------------------

    @activity.defn(name=CREATE)
    async def create(self, req: CloudCreate) -> CloudCreated:
        key = self._key(retryable=False)
        creator = MiniMaxCreator(
            self._client, self._store, self._http, self._settings.input_allow_hosts
        )
        done = await self._create_once(req, lambda hb: creator.run(req, key, hb))
        if (made := cloud_create.created(done)) is not None:
            activity.logger.info(
                "MiniMax task %s created for job %s (create requests sent: %d)",
                made.task_id,
                req.job_id,
                made.create_calls,
            )
            return made
        verdict = done.verdict
        if verdict.outcome == "refused" and verdict.code in PERMANENT_CODES:
            raise ApplicationError(
                permanent_message(verdict.code, verdict.message, task_id=None),
                {
                    "job_id": req.job_id,
                    "code": verdict.code,
                    "settled": done.settled,
                    "release": done.release,
                },
                type=PERMANENT,
                non_retryable=True,
            )
        if verdict.outcome == "refused":
            raise ApplicationError(
                verdict.message,
                {
                    "job_id": req.job_id,
                    "create_calls": verdict.attempts,
                    "settled": done.settled,
                    "release": done.release,
                },
                type=CREATE_GAVE_UP,
                non_retryable=True,
            )
        raise creator.ambiguous(req, verdict)

    # --- poll: free, retried by Temporal without limit -------------------------------------

    @activity.defn(name=POLL)
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

    @activity.defn(name=DOWNLOAD)
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


def _cost_key(request: CloudRequest, settings: Settings) -> str:
    return f"{request.resolution}/{request.duration}s"  # routing_tiers.json, "768P/6s"


PROVIDER = CloudProvider(
    name="minimax",
    create_activity=CREATE,
    poll_activity=POLL,
    label="MiniMax",
    console="MiniMax's console (platform.minimax.io: usage / billing, video generation tasks)",
    key_names=("MINIMAX_API_KEY",),
    base_url_setting="MINIMAX_BASE_URL",
    activities=MiniMaxActivities,
    cost_key=_cost_key,
    longest_create_s=lambda s: MiniMaxTiming().longest_create_s(s.MINIMAX_CREATE_TIMEOUT_S),
    refused=frozenset({PERMANENT, CREATE_GAVE_UP}),
    no_key=NO_KEY,
    poll_final=(TASK_FAILED, PERMANENT),
    download_final=(PERMANENT,),
)
