"""The CLOUD route on Kling: three activities (create, poll, download) over `KlingClient`
(docs/design.md, "Kling facts").

Money invariant 2: the create runs inside `CreateGuard` (armed now, the right world, the spend
ledger's `begin`, the outcome settled) and the workflow never retries it. Unlike MiniMax, Kling
can be asked whether a create made a task: every create of a job's run carries the same
`external_task_id`, which Kling keeps unique per account. So a create that got no clear answer
is reconciled by querying that id (found: its task is the job's; not found: the same create is
sent again, and Kling cannot make a second task for that id) until the retry budget is spent;
only then is it ambiguous. A provable "no" (keys, account, resource pack) fails at once and the
workflow hands the job to the next provider. Polling and downloading cost nothing and may retry.

Money invariant 3: the keys live in the worker's settings and in the client only; no message,
log line, heartbeat or result here carries a key or a token (the client scrubs server texts).
"""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.cloud import provider as cloud_create
from activities.cloud.models import (
    CloudCreate,
    CloudCreated,
    CloudDone,
    CloudDownload,
    CloudPoll,
    CreateVerdict,
    LostCreate,
    Reconciled,
)
from activities.cloud.provider import CloudActivities, CloudProvider
from activities.heartbeat import Heartbeat, unless_shutting_down
from activities.inputs import InputUnreadable
from activities.kling.answers import REFUSED_CODES, TASK_NOT_FOUND, KlingTask
from activities.kling.client import KlingClient, KlingError, KlingTiming
from activities.kling.create import KlingCreator, ambiguous, find_lost_create, refused_message
from activities.kling.download import KlingDownloader
from activities.kling.errors import (
    CREATE_GAVE_UP,
    NO_KEY,
    REFUSED,
    TASK_FAILED,
    TASK_UNKNOWN,
    UNAVAILABLE,
    VIDEO_GONE,
    kling_failure,
)
from activities.kling.requests import (
    IMAGE_MAX_BYTES,
    Kind,
    cost_key,
    create_request,
    external_task_id,
    external_task_ids,
    kind_of,
)
from spillway.core.models import CloudRequest, Downloaded, Progress
from spillway.core.settings import Settings

# The activities' names: on the wire, in every job's history.
CREATE = "kling_create"
POLL = "kling_poll"
DOWNLOAD = "kling_download"
RECONCILE = "kling_reconcile"

KINDS: tuple[Kind, ...] = ("text2video", "image2video")
KEY_NAMES = ("KLING_ACCESS_KEY", "KLING_SECRET_KEY")


class KlingActivities(CloudActivities[KlingTiming]):
    def _default_timing(self, heartbeat_every_s: float) -> KlingTiming:
        return KlingTiming(
            heartbeat_every_s=heartbeat_every_s,
            create_timeout_s=self._settings.KLING_CREATE_TIMEOUT_S,
        )

    # --- create: the only call that costs money -----------------------------------------

    @activity.defn(name=CREATE)
    async def create(self, req: CloudCreate) -> CloudCreated:
        client = self._client(retryable=False)
        external = external_task_id(req.job_id, activity.info().workflow_run_id or "")
        done = await self._create_once(req, lambda hb: self._send_create(req, client, external, hb))
        if (made := cloud_create.created(done)) is not None:
            activity.logger.info(
                "Kling task %s created for job %s (external_task_id %s, create requests: %d)",
                made.task_id,
                req.job_id,
                external,
                made.create_calls,
            )
            return made
        verdict = done.verdict
        details = {
            "job_id": req.job_id,
            "code": verdict.code,
            "create_calls": verdict.attempts,
            "settled": done.settled,
            "release": done.release,
        }
        if verdict.outcome == "refused" and verdict.code in REFUSED_CODES:
            raise ApplicationError(
                refused_message(req.job_id, verdict), details, type=REFUSED, non_retryable=True
            )
        if verdict.outcome == "refused":
            # attempts 0: refused here before sending; else every try was a provable "not now".
            kind = REFUSED if verdict.attempts == 0 else CREATE_GAVE_UP
            raise ApplicationError(verdict.message, details, type=kind, non_retryable=True)
        raise ambiguous(req, verdict, external, str(self._settings.KLING_BASE_URL))

    async def _send_create(
        self, req: CloudCreate, client: KlingClient, external: str, hb: Heartbeat
    ) -> CreateVerdict:
        s = self._settings
        try:
            # Read before anything is sent: an input that cannot be read costs nothing. Kling's
            # `image` takes bare base64 (create_request strips the data URL's prefix), and one
            # byte over its limit is enough to know it is over (create_request says so).
            frame = None
            if req.first_frame is not None:
                frame = await cloud_create.first_frame(
                    self._store,
                    self._http,
                    req.first_frame,
                    IMAGE_MAX_BYTES + 1,
                    s.input_allow_hosts,
                )
            kind, body = create_request(
                req.request,
                external_task_id=external,
                model=s.KLING_MODEL,
                mode=s.KLING_MODE,
                first_frame=frame,
            )
        except (ValueError, InputUnreadable) as exc:
            return CreateVerdict(
                outcome="refused",
                attempts=0,
                message=f"Kling would refuse job {req.job_id}'s request ({exc}): nothing was "
                "sent to Kling and nothing was charged",
            )
        creator = KlingCreator(client, self._timing, req.job_id, external, hb)
        return await creator.run(kind, body)

    # --- reconcile: free; after a create whose worker was lost ------------------------------

    @activity.defn(name=RECONCILE)
    async def reconcile(self, req: LostCreate) -> Reconciled:
        """Whether a create whose worker was lost before it answered made a task, asked of Kling
        by the external_task_id of the run that sent it: the workflow follows the task it names.
        It never creates; a Kling that does not answer fails it retryably."""
        client = self._client(retryable=True)
        kind = kind_of(req.request, req.first_frame)  # as the create chose it
        task_id: str | None = None
        candidates = external_task_ids(req.job_id, req.run_id)
        external = candidates[0]
        async with Heartbeat(self._timing.heartbeat_every_s) as hb:
            try:
                for candidate in candidates:
                    task_id = await find_lost_create(
                        client, self._timing, kind, candidate, req.sent_at.timestamp(), hb
                    )
                    if task_id is not None:
                        external = candidate
                        break
            except KlingError as exc:
                explained = (
                    f"Kling refuses to say whether the lost create of job {req.job_id} made a "
                    f"task ({exc}): check KLING_ACCESS_KEY, KLING_SECRET_KEY and the account"
                )
                details = {"external_task_id": external, "code": exc.code}
                raise kling_failure(exc, UNAVAILABLE, REFUSED, explained, details) from None
        activity.logger.info(
            "lost Kling create of job %s (external_task_id %s): %s",
            req.job_id,
            external,
            f"task {task_id}" if task_id else "no task",
        )
        return Reconciled(external_task_id=external, task_id=task_id)

    # --- poll: free, retried by Temporal ---------------------------------------------------

    @activity.defn(name=POLL)
    async def poll(self, req: CloudPoll) -> CloudDone:
        return await unless_shutting_down(self._poll(req))

    async def _poll(self, req: CloudPoll) -> CloudDone:
        client = self._client(retryable=True)
        interval, phase = self._settings.KLING_POLL_INTERVAL_S, "polling"
        kinds, unknown = KINDS, 0
        async with Heartbeat(self._timing.heartbeat_every_s, Progress(phase=phase)) as hb:
            while True:
                found = await self._find(client, req, kinds)
                if found is None:
                    unknown += 1
                    if unknown >= self._timing.unknown_task_polls:
                        raise ApplicationError(
                            f"Kling reports no task {req.task_id} (job {req.job_id}) under "
                            f"text2video or image2video after {unknown} queries: check Kling's "
                            "console with the account of KLING_ACCESS_KEY",
                            {"task_id": req.task_id},
                            type=TASK_UNKNOWN,
                            non_retryable=True,
                        )
                    await asyncio.sleep(interval)
                    continue
                kind, task = found
                kinds, unknown = (kind,), 0  # the task's kind never changes
                if task.status == "failed":
                    said = client.clean(task.message) or "no reason given"
                    raise ApplicationError(
                        f"Kling task {req.task_id} of job {req.job_id} failed: {said}",
                        {"task_id": req.task_id, "task_status_msg": said},
                        type=TASK_FAILED,
                        non_retryable=True,
                    )
                if task.status == "succeed":
                    return self._done(req, task)
                if task.status != phase:
                    phase = task.status
                    hb.update(Progress(phase=phase), now=True)
                await asyncio.sleep(interval)

    async def _find(
        self, client: KlingClient, req: CloudPoll, kinds: tuple[Kind, ...]
    ) -> tuple[Kind, KlingTask] | None:
        # CloudPoll names no kind and Kling's query path needs one: ask under each until one
        # knows the task (an unknown id answers "does not exist" under the other kind).
        for kind in kinds:
            try:
                return kind, await client.query(kind, req.task_id)
            except KlingError as exc:
                if exc.code == TASK_NOT_FOUND:
                    continue
                refusal = _refusal(req, exc)
                details = {"task_id": req.task_id, "code": exc.code}
                raise kling_failure(exc, UNAVAILABLE, REFUSED, refusal, details) from None
        return None

    def _done(self, req: CloudPoll, task: KlingTask) -> CloudDone:
        if not task.video_urls:
            raise ApplicationError(
                f"Kling reports task {req.task_id} done but names no video", type=UNAVAILABLE
            )
        if task.units is not None:
            activity.logger.info(
                "Kling task %s of job %s used %g resource-pack units",
                req.task_id,
                req.job_id,
                task.units,
            )
        # cost_usd stays None; the units go to the plan (cloud.units). Kling's query answer (like
        # its callback) reports the actual cost only as `final_unit_deduction`, resource-pack
        # units (a decimal string); the newer `billing` list (charge_type cash|unit, amount,
        # currency) belongs to Kling's newer API design, not to /v1/videos/{kind}/{id}
        # (klingai.com/document-api/api/get-started/callbacks; .../api/video/2-6/text-to-video).
        # What a unit costs in dollars depends on the pack the account bought, so the estimate
        # of routing_tiers.json stands.
        return CloudDone(task_id=req.task_id, video_url=task.video_urls[0], units=task.units)

    # --- download: free; a re-run never fetches a finished file again ---------------------

    @activity.defn(name=DOWNLOAD)
    async def download(self, req: CloudDownload) -> Downloaded:
        return await unless_shutting_down(self._download(req))

    async def _download(self, req: CloudDownload) -> Downloaded:
        base = str(self._settings.KLING_BASE_URL)
        return await KlingDownloader(self._http, base, self._timing, self._store).run(req)

    # --- shared ---------------------------------------------------------------------------

    def _client(self, *, retryable: bool) -> KlingClient:
        # Poll is retryable without keys: the task exists and is paid for, so a worker that has
        # them (or this one, fixed and restarted) may still follow it.
        s = self._settings
        keys = (s.KLING_ACCESS_KEY, s.KLING_SECRET_KEY)
        values = [key.get_secret_value().strip() if key else "" for key in keys]
        missing = [name for name, value in zip(KEY_NAMES, values, strict=True) if not value]
        if missing:
            raise ApplicationError(
                f"no Kling keys on this worker: set {' and '.join(missing)} in the worker's "
                "environment (Kling needs both KLING_ACCESS_KEY and KLING_SECRET_KEY); nothing "
                "was sent to Kling",
                type=NO_KEY,
                non_retryable=not retryable,
            )
        return KlingClient(self._http, str(s.KLING_BASE_URL), values[0], values[1], self._timing)


def _refusal(req: CloudPoll, exc: KlingError) -> str:
    return (
        f"Kling refuses to report task {req.task_id} of job {req.job_id} ({exc}): check "
        "KLING_ACCESS_KEY, KLING_SECRET_KEY and the account. The task exists and may be charged; "
        "its video stays in Kling's console for 30 days."
    )


def _cost_key(request: CloudRequest, settings: Settings) -> str:
    return cost_key(request, settings.KLING_MODE)  # routing_tiers.json, "std/5s"


PROVIDER = CloudProvider(
    name="kling",
    create_activity=CREATE,
    poll_activity=POLL,
    label="Kling",
    console="Kling's console (task list and resource pack usage)",
    key_names=KEY_NAMES,
    base_url_setting="KLING_BASE_URL",
    activities=KlingActivities,
    cost_key=_cost_key,
    longest_create_s=lambda s: KlingTiming(
        create_timeout_s=s.KLING_CREATE_TIMEOUT_S
    ).longest_create_s(),
    refused=frozenset({REFUSED, CREATE_GAVE_UP}),
    no_key=NO_KEY,
    poll_final=(TASK_FAILED, REFUSED),
    download_final=(VIDEO_GONE,),
    reconciles=True,
)
