"""The LOCAL route's activities: submit a graph to ComfyUI once, follow it to its end, bring its
files home, put input images in, and take a prompt back out of ComfyUI when its job is cancelled
(docs/design.md, "ComfyUI facts").

ComfyUI keeps its queue and history in memory and never deduplicates a prompt_id, so every
decision here is read off `/queue` (first) and `/history/{id}` (second): a prompt finishing
between the two reads is then seen in history, never as missing.

Waits share one watcher per agent and ComfyUI (watch.py: one WebSocket, one poll loop), so a
thousand waiting jobs cost one socket (docs/design.md, "GPU hosts and agents"). The worker stops
it with `await ComfyUIActivities.aclose()` once its Temporal workers are done. Outputs go to the
output store the worker passes as `store=` (without one, the activities open their own at first
use and `aclose()` closes it too).
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import httpx
from pydantic import ValidationError
from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from activities.comfyui.answers import Queued, Seen, rejection_message
from activities.comfyui.capabilities import Capabilities
from activities.comfyui.client import (
    CONNECT_TIMEOUT_S,
    ComfyUIClient,
    Rejected,
    Unanswered,
    Unavailable,
)
from activities.comfyui.errors import activity_errors, finished
from activities.comfyui.files import ComfyUIFiles
from activities.comfyui.models import (
    EARLIER_RUN_HOLDS,
    GRAPH_REJECTED,
    NO_POOL,
    PLACE_TAKEN,
    UNSUPPORTED,
    ComfyUICancel,
    ComfyUICancelled,
    ComfyUIDownload,
    ComfyUIDownloaded,
    ComfyUIFinished,
    ComfyUIFit,
    ComfyUISubmit,
    ComfyUISubmitted,
    ComfyUIUpload,
    ComfyUIUploaded,
    ComfyUIWait,
    HostFit,
    Release,
    of_another_run,
    of_run,
)
from activities.comfyui.silence import Retried, bounded_by_silence
from activities.comfyui.stall import RUNNING, Movement
from activities.comfyui.watch import ComfyUIWatcher, Ended, Silent
from activities.heartbeat import Heartbeat, ProgressRelay, unless_shutting_down
from activities.pool import pool_holds
from activities.storage.opening import OwnsOutputStore
from activities.storage.store import OutputStore
from spillway.core import names
from spillway.core.models import Progress, RenderProgress
from spillway.core.settings import Settings, shown

# How long after a POST /prompt that got no answer it may still land in ComfyUI's queue, in
# request timeouts (COMFYUI_REQUEST_TIMEOUT_S). The client gave up after one timeout; ComfyUI
# validates a graph before queueing it, which a loaded machine (or a proxy holding the request)
# can drag out, so another full timeout is the margin. A retry that finds nothing waits this out
# before posting.
POST_GRACE_TIMEOUTS = 2
# The longest a submit asks the GPU pool whether the job's place is still its own.
PLACE_CHECK_S = 5.0


_SILENT = Progress(phase="ComfyUI not answering")


class SubmitProgress(Retried):
    """A submit's heartbeat details. `posted_at`: when an attempt sent a POST /prompt that got
    no answer, so the next attempt, on whichever agent, knows it may still land."""

    posted_at: datetime | None = None


class ComfyUIActivities(OwnsOutputStore):
    def __init__(
        self,
        http: httpx.AsyncClient,
        settings: Settings,
        *,
        heartbeat_every_s: float | None = None,
        post_grace_s: float | None = None,
        store: OutputStore | None = None,
        temporal: Client | None = None,
    ) -> None:
        """`temporal`: where the GPU pool is asked whether a job still holds its place before a
        submit posts (None: not asked, as for activities tested alone)."""
        self._settings, self._temporal = settings, temporal
        url = str(settings.COMFYUI_URL)
        self._client = ComfyUIClient(
            http,
            url,
            request_timeout=_timeout(settings.COMFYUI_REQUEST_TIMEOUT_S),
            download_timeout=_timeout(settings.COMFYUI_DOWNLOAD_TIMEOUT_S),
        )
        self._watcher = ComfyUIWatcher(self._client, settings.COMFYUI_HISTORY_POLL_S)
        # Six beats per heartbeat timeout, so a slow ComfyUI never looks like a dead worker; waits
        # three (the SDK sends one per 0.8 timeout anyway; 1,000 waits at six: 200 calls/s).
        self._heartbeat_every_s = heartbeat_every_s or settings.SPILLWAY_HEARTBEAT_TIMEOUT_S / 6
        self._wait_beat_s = heartbeat_every_s or settings.SPILLWAY_HEARTBEAT_TIMEOUT_S / 3
        self._post_grace_s = (
            post_grace_s or POST_GRACE_TIMEOUTS * settings.COMFYUI_REQUEST_TIMEOUT_S
        )
        # What this host can run, read again after COMFYUI_CAPABILITIES_REFRESH_S; one read at a
        # time, however many jobs ask.
        self._capabilities: Capabilities | None = None
        self._reading = asyncio.Lock()
        self._files = ComfyUIFiles(
            self._client,
            self._use_store(settings, store),
            http,
            settings.input_allow_hosts,
        )

    @property
    def client_id(self) -> str:
        """The agent's ComfyUI client id: prompts are posted, and followed, under it."""
        return self._watcher.client_id

    async def aclose(self) -> None:
        """Stops the watcher (its socket and poll loop); waits still following end retryably.
        Closes the output store too if these activities opened their own."""
        await self._watcher.aclose()
        await super().aclose()

    # --- submit ------------------------------------------------------------------------------

    @activity.defn(name=names.COMFYUI_SUBMIT)
    async def submit(self, req: ComfyUISubmit) -> ComfyUISubmitted:
        """Posts under the agent's client id: ComfyUI sends a prompt's messages only to the
        client that submitted it, and the agent's one socket listens under its own id."""
        self._watcher.start()  # the socket is open before the prompt can start
        earlier = self._earlier_post(req)
        if earlier is None:  # an attempt that posted had its place confirmed before
            await self._place_or_posted(req)
        async with Heartbeat(self._heartbeat_every_s) as heartbeat:
            # Not beaten on entry: the "posting" beat below must be this attempt's first.
            heartbeat.update(SubmitProgress(phase="looking", posted_at=earlier))
            with activity_errors(), bounded_by_silence(self._client, heartbeat, req):
                # Absent while an earlier POST may still land: give it its grace first.
                until = None if earlier is None else earlier.timestamp() + self._post_grace_s
                waiting = SubmitProgress(phase="waiting for an earlier POST", posted_at=earlier)
                if req.reset_run:
                    await self._no_earlier_run(req)
                if self._first_post(earlier, req):
                    seen = Seen("absent")  # saves a GET /queue (MBs behind a backlog) per job
                else:
                    seen = await self._located(req.prompt_id, until, heartbeat, waiting)
                if seen.where != "absent":
                    # An earlier try posted it (its answer was lost): posting again runs it twice.
                    activity.logger.info("prompt %s already %s", req.prompt_id, seen.where)
                    return ComfyUISubmitted(prompt_id=req.prompt_id, posted=False)
                answer = await self._post(req, heartbeat)
                if answer.get("node_errors"):
                    # Accepted, but the outputs with errors would silently not run: take it out.
                    await self._client.withdraw(req.prompt_id)
                    message = rejection_message(answer, req.graph)
                    message += " (the rest was removed from ComfyUI's queue)"
                    raise ApplicationError(message, answer, type=GRAPH_REJECTED, non_retryable=True)
                if answer.get("prompt_id") != req.prompt_id:
                    await self._client.withdraw(str(answer.get("prompt_id")))
                    raise ApplicationError(
                        f"ComfyUI at {shown(self._settings.COMFYUI_URL)} ignored the prompt_id "
                        f"it was given (answered {answer.get('prompt_id')!r}): without it a retry "
                        "could run the job twice; use a ComfyUI that accepts a caller's prompt_id "
                        "(0.3.64 does)",
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

    async def _place_or_posted(self, req: ComfyUISubmit) -> None:
        """`_place_is_mine`, but a retry whose earlier attempt may have posted without saying so
        (its worker died before its heartbeat went out) follows a prompt ComfyUI has: that
        attempt's check had passed, and "nothing was posted" would be untrue."""
        try:
            await self._place_is_mine(req)
        except ApplicationError as refused:
            if refused.type not in (PLACE_TAKEN, NO_POOL) or self._first_post(None, req):
                raise
            if (await self._client.locate(req.prompt_id)).where == "absent":
                raise
            activity.logger.info("prompt %s posted by an earlier attempt: followed", req.prompt_id)

    async def _place_is_mine(self, req: ComfyUISubmit) -> None:
        """A job posts only on a place the running GPU pool shows as its own, for its own ask:
        the answer that gave it may be anyone's signal, and a run reset to after its admission
        replays a place its earlier run gave back, which the pool may have handed on (either
        way the card would hold one prompt more than its places). No pool running: nothing is
        posted until one runs, which the job starts by asking again."""
        if req.place_on is None or self._temporal is None:
            return
        if req.place_asked_at is None and not req.reset_run:
            return  # a job of 0.6.0: its place was not taken on an answer's word
        queue = req.jobs_queue or self._settings.SPILLWAY_TASK_QUEUE
        within = _before_first_beat()
        try:
            async with asyncio.timeout(within):
                holds = await pool_holds(
                    self._temporal,
                    queue,
                    req.job_id,
                    req.place_on,
                    req.place_asked_at,
                    timedelta(seconds=within),
                )
        except (TimeoutError, RPCError) as exc:
            raise ApplicationError(
                f"the GPU pool did not say within {within:g} s whether job {req.job_id} holds "
                f"its place on {req.place_on} ({type(exc).__name__}): nothing was posted; "
                "asked again"
            ) from None
        if holds is None and req.place_asked_at is not None:
            raise ApplicationError(
                f"no GPU pool runs for task queue {queue!r} to say whether job {req.job_id} "
                f"holds its place on {req.place_on}: nothing was posted; the job asks again, "
                "which starts one",
                type=NO_POOL,
                non_retryable=True,
            )
        if holds is False:
            raise ApplicationError(
                f"the GPU pool shows no place of job {req.job_id} on {req.place_on} for its ask "
                "(an answer that was not the pool's, or a run reset to after its admission whose "
                "place has gone back since): nothing was posted; the job asks again",
                type=PLACE_TAKEN,
                non_retryable=True,
            )

    async def _no_earlier_run(self, req: ComfyUISubmit) -> None:
        """A run made by a reset posts only once ComfyUI holds no prompt of the run it was made
        from: reset while that one rendered, it would otherwise post a second prompt on the
        job's one place."""
        queue = await self._client.queue()
        earlier = sorted(p for p in queue if of_another_run(p, req.prompt_id))
        if earlier:
            raise ApplicationError(
                f"ComfyUI still holds {', '.join(earlier)} of the run job {req.job_id} was reset "
                "from: nothing was posted; they are taken out first",
                earlier,
                type=EARLIER_RUN_HOLDS,
                non_retryable=True,
            )

    async def _post(self, req: ComfyUISubmit, heartbeat: Heartbeat) -> dict[str, Any]:
        # Said before sending: an attempt that dies mid-POST has said so already.
        sent = SubmitProgress(phase="posting", posted_at=datetime.now(UTC))
        heartbeat.update(sent, now=True)
        try:
            return await self._client.post_prompt(
                req.graph, client_id=self.client_id, prompt_id=req.prompt_id, front=req.front
            )
        except Rejected as exc:
            raise ApplicationError(
                rejection_message(exc.answer, req.graph),
                exc.answer,
                type=GRAPH_REJECTED,
                non_retryable=True,
            ) from None
        except Unavailable as exc:
            if not isinstance(exc, Unanswered):  # answered: it will not be queued later
                heartbeat.update(SubmitProgress(phase="refused"), now=True)
            raise

    async def _located(
        self, prompt_id: str, until: float | None, heartbeat: Heartbeat, waiting: Progress
    ) -> Seen:
        """Where the prompt is. Absent while a POST may still land (before `until`, a
        time.time()): looks again every poll interval, showing `waiting`, and once at the end."""
        seen = await self._client.locate(prompt_id)
        if seen.where == "absent" and until is not None and time.time() < until:
            activity.logger.info("prompt %s not in ComfyUI yet: a POST may land", prompt_id)
            heartbeat.update(waiting, now=True)
        while seen.where == "absent" and until is not None and (left := until - time.time()) > 0:
            await asyncio.sleep(min(self._settings.COMFYUI_HISTORY_POLL_S, left))
            seen = await self._client.locate(prompt_id)
        return seen

    @staticmethod
    def _first_post(earlier: datetime | None, req: ComfyUISubmit) -> bool:
        """Nothing can hold this prompt yet: its id is its run's own and no attempt before this
        one existed (Temporal starts each attempt once; a retry is attempt 2 and looks; a call
        after a silence of the host is the workflow's retry)."""
        return earlier is None and activity.info().attempt == 1 and req.silent_since is None

    def _earlier_post(self, req: ComfyUISubmit) -> datetime | None:
        """When an earlier attempt sent a POST of this prompt that got no answer: this agent's
        own record, else the failed attempt's last heartbeat, which Temporal hands to the next
        attempt (the SDK sends it on failure, throttled or not), wherever that one runs, else
        what an earlier call that the host's silence ended handed on."""
        if req.prompt_id in self._client.posts:
            return self._client.posts[req.prompt_id]
        details = activity.info().heartbeat_details
        try:
            carried = SubmitProgress.model_validate(details[0]).posted_at if details else None
        except ValidationError:
            carried = None
        return carried or req.posted_at

    # --- what the host can run ----------------------------------------------------------------

    @activity.defn(name=names.COMFYUI_FIT)
    async def fit(self, req: ComfyUIFit) -> HostFit:
        """Whether this host can run the job's graph, by its own ComfyUI's `GET /object_info`
        (kept here, never in a history). Not read: the host is not ruled out (HostFit)."""
        self._watcher.start()  # its socket tells when ComfyUI restarted
        try:
            capabilities = await self._read_capabilities()
        except Unavailable as exc:
            activity.logger.warning("what ComfyUI can run was not read: %s", exc)
            return HostFit(error=str(exc))
        return HostFit(
            missing=capabilities.missing(req.needs),
            read_at=capabilities.read_at,
            host=capabilities.brief(),
        )

    async def _read_capabilities(self) -> Capabilities:
        refresh = timedelta(seconds=self._settings.COMFYUI_CAPABILITIES_REFRESH_S)
        async with self._reading:
            known = self._capabilities
            if (
                known is None
                or datetime.now(UTC) - known.read_at >= refresh
                or known.read_at.timestamp() < self._watcher.connected_at  # restarted since
            ):
                self._capabilities = known = await self._client.capabilities()
            return known

    # --- wait --------------------------------------------------------------------------------

    @activity.defn(name=names.COMFYUI_WAIT)
    async def wait(self, req: ComfyUIWait) -> ComfyUIFinished:
        return await unless_shutting_down(self._wait(req))

    async def _wait(self, req: ComfyUIWait) -> ComfyUIFinished:
        # Beats without details until the watcher says where the prompt is. The watcher follows
        # the prompt under the agent's client id.
        told = req.silent_since.timestamp() if req.silent_since is not None else None
        stall = self._settings.RENDER_STALL_S if req.stall_rule else 0.0
        moved = Movement()
        temporal = self._temporal if req.relay_progress else None
        async with (
            Heartbeat(self._wait_beat_s) as heartbeat,
            ProgressRelay(temporal) as relay,
            self._watcher.follow(req.prompt_id, answers=told is not None) as following,
        ):
            while True:
                try:
                    with activity_errors():
                        news = await asyncio.wait_for(following.next(), moved.left(stall))
                except TimeoutError:
                    return moved.stalled(req.prompt_id)
                moved.saw(news)
                if isinstance(news, Silent):
                    if news.since is None:
                        return ComfyUIFinished(prompt_id=req.prompt_id, outcome="back")
                    since = news.since if told is None else min(news.since, told)
                    if time.time() - since >= req.report_silence_after_s:
                        return ComfyUIFinished(
                            prompt_id=req.prompt_id,
                            outcome="unreachable",
                            silent_since=datetime.fromtimestamp(since, UTC),
                        )
                    heartbeat.update(_SILENT)
                    continue
                if isinstance(news, Ended):
                    if news.entry is None:
                        return ComfyUIFinished(prompt_id=req.prompt_id, outcome="lost")
                    return finished(req.prompt_id, news.entry)
                shown = heartbeat.details
                if news == RUNNING and shown is not None and shown.phase == "running":
                    continue  # "running" with a node or a percentage says more: keep it
                # At once: the SDK sends the latest to the server every PROGRESS_EVERY_S.
                heartbeat.update(news, now=news != shown)
                relay.send(RenderProgress(prompt_id=req.prompt_id, progress=news))

    # --- files: outputs home, input images in ------------------------------------------------

    @activity.defn(name=names.COMFYUI_DOWNLOAD)
    async def download(self, req: ComfyUIDownload) -> ComfyUIDownloaded:
        return await unless_shutting_down(self._download(req))

    async def _download(self, req: ComfyUIDownload) -> ComfyUIDownloaded:
        async with Heartbeat(self._heartbeat_every_s) as heartbeat:
            with activity_errors(), bounded_by_silence(self._client, heartbeat, req):
                downloaded = await self._files.download(req, heartbeat)
        released = req.release is not None and await _give_back(req.release)
        return ComfyUIDownloaded(outputs=downloaded.outputs, released=released)

    @activity.defn(name=names.COMFYUI_UPLOAD)
    async def upload(self, req: ComfyUIUpload) -> ComfyUIUploaded:
        """Puts one input image into this host's ComfyUI under a content-hash name and returns
        the name its LoadImage takes; safe to retry (docs/design.md, "ComfyUI facts")."""
        async with Heartbeat(self._heartbeat_every_s, Progress(phase="uploading")) as heartbeat:
            with activity_errors(), bounded_by_silence(self._client, heartbeat, req):
                return await self._files.upload(req)

    # --- cancel ------------------------------------------------------------------------------

    @activity.defn(name=names.COMFYUI_CANCEL)
    async def cancel(self, req: ComfyUICancel) -> ComfyUICancelled:
        if req.whole_run:
            return await self._cancel_run(req.prompt_id)
        was: Literal["pending", "running", "gone"] = "gone"
        # "Absent" counts only if it stays so: a POST still in flight may land just after a
        # first look. Looked for until a full interval later, or until the grace of this
        # agent's own unanswered POST of it is over, whichever is later.
        until = time.time() + self._settings.COMFYUI_HISTORY_POLL_S
        if posted := self._client.posts.get(req.prompt_id):
            until = max(until, posted.timestamp() + self._post_grace_s)
        with activity_errors():
            async with Heartbeat(self._heartbeat_every_s) as heartbeat:
                looking = Progress(phase="looking for a late prompt")
                seen = await self._located(req.prompt_id, until, heartbeat, looking)
                where = seen.where if seen.where in ("pending", "running") else None
                while where is not None:
                    was = where if was == "gone" else was
                    await self._take_out(req.prompt_id, where)
                    heartbeat.update(Progress(phase=f"cancelling {where}"))
                    await asyncio.sleep(min(self._settings.COMFYUI_HISTORY_POLL_S, 1.0))
                    where = await self._client.queued(req.prompt_id)
        activity.logger.info("prompt %s was %s and is out of ComfyUI", req.prompt_id, was)
        return ComfyUICancelled(prompt_id=req.prompt_id, was=was)

    async def _cancel_run(self, marker: str) -> ComfyUICancelled:
        """Takes out every prompt ComfyUI holds of `marker`'s run (one reset away from its place
        while it rendered) and returns once none is left."""
        with activity_errors():
            async with Heartbeat(self._heartbeat_every_s) as heartbeat:
                queue = await self._client.queue()
                held = {p: where for p, where in queue.items() if of_run(p, marker)}
                found = sorted(held)
                for prompt_id, where in held.items():
                    activity.logger.warning(
                        "prompt %s of a run reset away from its place is %s in ComfyUI: taken "
                        "out before the place is free",
                        prompt_id,
                        where,
                    )
                while held:
                    for prompt_id, where in held.items():
                        await self._take_out(prompt_id, where)
                    heartbeat.update(Progress(phase=f"taking out {len(held)} earlier prompt(s)"))
                    await asyncio.sleep(min(self._settings.COMFYUI_HISTORY_POLL_S, 1.0))
                    queue = await self._client.queue()
                    held = {p: queue[p] for p in held if p in queue}
        return ComfyUICancelled(prompt_id=marker, was="gone", taken_out=found)

    async def _take_out(self, prompt_id: str, where: Queued) -> None:
        # Newer ComfyUI cancels a job wherever it is. Otherwise pending: delete it; running:
        # ComfyUI stops it at the next node boundary. An interrupt naming a prompt_id is ignored
        # unless that prompt is the one running, so repeating it can never stop the next job.
        if await self._client.cancel_job(prompt_id):
            return
        if where == "pending":
            await self._client.delete_pending(prompt_id)
        else:
            await self._client.interrupt(prompt_id)


async def _give_back(release: Release) -> bool:
    """False: the pool did not take it (not running, the server busy): the job gives its place
    back itself. A give-back sent twice (a retried download) frees nothing twice: the pool knows
    each place by its ask."""
    pool = activity.client().get_workflow_handle(release.pool_id)
    try:
        await pool.signal(names.POOL_LEAVE, release.leave)
    except Exception as err:
        activity.logger.info("place not given back by the download: %s", err)
        return False
    return True


def _before_first_beat() -> float:
    """How long a submit's checks may take before its first heartbeat (the "posting" one must
    be the first): well within the heartbeat timeout, or an attempt that timed out in them while
    its POST went out after all would leave the next attempt posting again."""
    beat = activity.info().heartbeat_timeout
    return min(PLACE_CHECK_S, beat.total_seconds() / 3) if beat else PLACE_CHECK_S


def _timeout(seconds: float) -> httpx.Timeout:
    return httpx.Timeout(seconds, connect=min(seconds, CONNECT_TIMEOUT_S))
