"""Same-named stand-ins for the load probe and the route activities, for workflow tests that need
exact control (a scripted sequence of load readings, a prompt lost N times, a create that fails).
They count every call, so money invariants are checked on what the workflow scheduled."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.cloud import models as cloud
from activities.comfyui import models as comfyui
from activities.kling.activities import CREATE as KLING_CREATE
from activities.kling.activities import DOWNLOAD as KLING_DOWNLOAD
from activities.kling.activities import POLL as KLING_POLL
from activities.kling.activities import RECONCILE as KLING_RECONCILE
from activities.minimax.activities import CREATE as MINIMAX_CREATE
from activities.minimax.activities import DOWNLOAD as MINIMAX_DOWNLOAD
from activities.minimax.activities import POLL as MINIMAX_POLL
from activities.minimax.errors import CREATE_GAVE_UP as MINIMAX_GAVE_UP
from activities.probe.activities import LoadProbeRequest
from activities.spend.guard import Beginning, CreateGuard
from spillway.core import names
from spillway.core.ledger import BeginCreate
from spillway.core.models import ApprovalNotice, Downloaded, LoadStatus, OutputFile, Thresholds
from spillway.core.spend_book import token_of
from tests.support.constants import BUSY_VRAM_PCT, FREE_VRAM_PCT

SEED = Thresholds(vram_busy_pct=85, util_busy_pct=95)


def reading(reachable: bool = True, overloaded: bool = False, **extra: Any) -> LoadStatus:
    """A measurement as the probe reports it: the A40 free, busy (VRAM), or ComfyUI not there."""
    reasons = []
    if not reachable:
        reasons.append("comfyui_unreachable")
    if overloaded:
        reasons.append(f"vram_used_{BUSY_VRAM_PCT:.1f}pct_ge_{SEED.vram_busy_pct:.1f}pct")
    return LoadStatus(
        reachable=reachable,
        overloaded=overloaded,
        vram_pct=BUSY_VRAM_PCT if overloaded else (FREE_VRAM_PCT if reachable else None),
        reasons=reasons,
        measured_at=datetime.now(UTC),
        thresholds=SEED,
        **extra,
    )


FREE = reading()
BUSY = reading(overloaded=True)
DOWN = reading(reachable=False)


class RouteStubs:
    def __init__(self, *loads: LoadStatus) -> None:
        self.loads = list(loads) or [FREE]  # the last reading repeats
        self.calls: Counter[str] = Counter()
        self.submitted: list[str] = []
        self.lost = 0  # how many waits report LOST before one succeeds
        self.silent = 0  # how many waits report ComfyUI silent for 2 minutes before one goes on
        self.probe_failures = 0  # how many probes raise before one answers
        self.fail: dict[str, ApplicationError] = {}  # activity name -> error it raises
        self.missing: dict[str, list[str]] = {}  # host task queue -> what the host lacks
        self.notices: list[ApprovalNotice] = []
        self.probe_gate = asyncio.Event()
        self.probe_gate.set()  # clear it to hold every probe until set again
        self.wait_release = asyncio.Event()
        self.wait_release.set()  # clear it to keep the wait running until set again
        self.create_hang = False  # the create never returns and never heartbeats
        self.lost_before_begin = 0  # how many creates hang, silent, before the ledger's begin
        # How many MiniMax creates are refused by the provider (nothing made) with their settle
        # lost on the way to the ledger: the job itself must record the refusal.
        self.refused_unsettled = 0
        self.creates = 0  # create requests that got past the guard (would have cost money)
        self.reconciled: str | None = None  # the task Kling names for a lost create (None: none)
        self.guard: CreateGuard | None = None
        self.held: set[str] = set()  # names of the reads that run until `release` is set
        self.holding: set[str] = set()  # those running now
        self.release = asyncio.Event()

    async def hold(self, name: str) -> None:
        """Keeps a held read running (as a slow ledger would) until the test releases it."""
        if name in self.held:
            self.holding.add(name)
            await self.release.wait()

    def activities(self) -> list[Callable[..., Any]]:
        return [
            self.load,
            self.upload,
            self.submit,
            self.wait,
            self.download,
            self.cancel,
            self.fit,
            self.create,
            self.poll,
            self.cloud_download,
            self.kling_create,
            self.kling_reconcile,
            self.kling_poll,
            self.kling_download,
            self.notify,
        ]

    def _count(self, name: str) -> None:
        self.calls[name] += 1
        if name in self.fail:
            raise self.fail[name]

    @activity.defn(name=names.PROBE)
    async def load(self, req: LoadProbeRequest) -> LoadStatus:
        self.calls[names.PROBE] += 1
        await self.probe_gate.wait()
        if self.probe_failures:
            self.probe_failures -= 1
            raise RuntimeError("probe worker crashed")
        current = self.loads.pop(0) if len(self.loads) > 1 else self.loads[0]
        return current.model_copy(update={"measured_at": datetime.now(UTC)})

    @activity.defn(name=names.COMFYUI_UPLOAD)
    async def upload(self, req: comfyui.ComfyUIUpload) -> comfyui.ComfyUIUploaded:
        self._count(names.COMFYUI_UPLOAD)
        sha256 = req.input.sha256 or "0" * 64
        return comfyui.ComfyUIUploaded(
            node=req.input.node, name=f"spillway/{sha256}.png", sha256=sha256
        )

    @activity.defn(name=names.COMFYUI_SUBMIT)
    async def submit(self, req: comfyui.ComfyUISubmit) -> comfyui.ComfyUISubmitted:
        self._count(names.COMFYUI_SUBMIT)
        self.submitted.append(req.prompt_id)
        return comfyui.ComfyUISubmitted(
            prompt_id=req.prompt_id, number=len(self.submitted), posted=True
        )

    @activity.defn(name=names.COMFYUI_WAIT)
    async def wait(self, req: comfyui.ComfyUIWait) -> comfyui.ComfyUIFinished:
        self._count(names.COMFYUI_WAIT)
        while not self.wait_release.is_set():
            activity.heartbeat()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wait_release.wait(), timeout=0.2)
        if self.lost:
            self.lost -= 1
            return comfyui.ComfyUIFinished(prompt_id=req.prompt_id, outcome="lost")
        if self.silent:
            self.silent -= 1
            since = datetime.now(UTC) - timedelta(minutes=2)
            return comfyui.ComfyUIFinished(
                prompt_id=req.prompt_id, outcome="unreachable", silent_since=since
            )
        video = comfyui.ComfyUIFile(
            node_id="3", kind="images", filename="v_00001_.mp4", subfolder="video"
        )
        return comfyui.ComfyUIFinished(prompt_id=req.prompt_id, outcome="success", files=[video])

    @activity.defn(name=names.COMFYUI_DOWNLOAD)
    async def download(self, req: comfyui.ComfyUIDownload) -> Downloaded:
        self._count(names.COMFYUI_DOWNLOAD)
        return Downloaded(
            outputs=[
                OutputFile(path=f"outputs/{req.job_id}/{f.filename}", bytes=1024, sha256="ab" * 32)
                for f in req.files
            ]
        )

    @activity.defn(name=names.COMFYUI_CANCEL)
    async def cancel(self, req: comfyui.ComfyUICancel) -> comfyui.ComfyUICancelled:
        self._count(names.COMFYUI_CANCEL)
        return comfyui.ComfyUICancelled(prompt_id=req.prompt_id, was="running")

    @activity.defn(name=names.COMFYUI_FIT)
    async def fit(self, req: comfyui.ComfyUIFit) -> comfyui.HostFit:
        """Every host can run every graph (`missing`: what one lacks, by host queue)."""
        self._count(names.COMFYUI_FIT)
        return comfyui.HostFit(missing=self.missing.get(activity.info().task_queue, []))

    @activity.defn(name=MINIMAX_CREATE)
    async def create(self, req: cloud.CloudCreate) -> cloud.CloudCreated:
        return await self._create(MINIMAX_CREATE, req)

    @activity.defn(name=KLING_CREATE)
    async def kling_create(self, req: cloud.CloudCreate) -> cloud.CloudCreated:
        return await self._create(KLING_CREATE, req)

    async def _create(self, name: str, req: cloud.CloudCreate) -> cloud.CloudCreated:
        """Inside the real CreateGuard (armed now? the ledger's begin and settle): only the
        request to the provider is stubbed. `creates` counts the requests that would have left."""

        async def send() -> cloud.CreateVerdict:
            self.creates += 1
            if self.create_hang:
                await asyncio.sleep(3600)
            return cloud.CreateVerdict(outcome="created", task_id=f"task-{req.job_id}")

        self._count(name)
        if self.lost_before_begin:  # a worker starved or killed as the activity started
            self.lost_before_begin -= 1
            await asyncio.sleep(3600)
        assert self.guard is not None, "the job runner sets the guard"
        if name == MINIMAX_CREATE and self.refused_unsettled:
            self.refused_unsettled -= 1
            # As the guard begins, then the provider's "no" whose settle never reached the ledger.
            info = activity.info()
            run_id = info.workflow_run_id or ""
            nonce = uuid.uuid4().hex
            activity.heartbeat(Beginning(phase="reserving", token=token_of(nonce)))
            begin = BeginCreate(
                job_id=req.job_id,
                run_id=run_id,
                attempt=f"{run_id}/{info.activity_id}/{info.attempt}",
                token=token_of(nonce),
            )
            await self.guard.ledger.begin(begin)
            self.creates += 1
            raise ApplicationError(
                "MiniMax refused: insufficient balance (1008)",
                {"job_id": req.job_id, "settled": False, "release": nonce},
                type=MINIMAX_GAVE_UP,
                non_retryable=True,
            )
        nonce = uuid.uuid4().hex
        activity.heartbeat(Beginning(phase="reserving", token=token_of(nonce)))  # as the guard's
        done = await self.guard.create(req.job_id, req.authorisation, req.simulated, send, nonce)
        assert done.verdict.task_id is not None
        return cloud.CloudCreated(task_id=done.verdict.task_id, settled=done.settled)

    @activity.defn(name=KLING_RECONCILE)
    async def kling_reconcile(self, req: cloud.LostCreate) -> cloud.Reconciled:
        self._count(KLING_RECONCILE)
        await self.hold(KLING_RECONCILE)
        return cloud.Reconciled(external_task_id=f"spillway-{req.job_id}", task_id=self.reconciled)

    @activity.defn(name=MINIMAX_POLL)
    async def poll(self, req: cloud.CloudPoll) -> cloud.CloudDone:
        self._count(MINIMAX_POLL)
        return cloud.CloudDone(task_id=req.task_id, file_id="205258526306433", video_width=1366)

    @activity.defn(name=KLING_POLL)
    async def kling_poll(self, req: cloud.CloudPoll) -> cloud.CloudDone:
        self._count(KLING_POLL)
        return cloud.CloudDone(task_id=req.task_id, video_url="https://cdn.example/v.mp4")

    @activity.defn(name=MINIMAX_DOWNLOAD)
    async def cloud_download(self, req: cloud.CloudDownload) -> Downloaded:
        return self._downloaded(MINIMAX_DOWNLOAD, req)

    @activity.defn(name=KLING_DOWNLOAD)
    async def kling_download(self, req: cloud.CloudDownload) -> Downloaded:
        return self._downloaded(KLING_DOWNLOAD, req)

    def _downloaded(self, name: str, req: cloud.CloudDownload) -> Downloaded:
        self._count(name)
        path = f"outputs/{req.job_id}/{req.task_id}.mp4"
        return Downloaded(outputs=[OutputFile(path=path, bytes=2048, sha256="cd" * 32)])

    @activity.defn(name=names.NOTIFY_APPROVAL)
    async def notify(self, notice: ApprovalNotice) -> None:
        self._count(names.NOTIFY_APPROVAL)
        self.notices.append(notice)
