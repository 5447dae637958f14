"""The sending side of a MiniMax create (activities.py runs it inside `CreateGuard`):
sent again only after a provable "not now", within the timing's retry budget, and the
ambiguous failure that says how to check for a task once a request may have reached MiniMax.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.cloud import provider as cloud_create
from activities.cloud.models import CloudCreate, CreateVerdict
from activities.cloud.provider import Backoff
from activities.heartbeat import Heartbeat
from activities.inputs import InputUnreadable
from activities.minimax.client import MiniMaxClient
from activities.minimax.errors import AMBIGUOUS_CREATE
from activities.storage.store import OutputStore
from spillway.core.images import FIRST_FRAME_MAX_BYTES
from spillway.core.models import Progress


@dataclass
class MiniMaxCreator:
    client: MiniMaxClient
    store: OutputStore
    http: httpx.AsyncClient
    allow: frozenset[str]  # SPILLWAY_INPUT_ALLOW_HOSTS

    async def run(self, req: CloudCreate, key: str, hb: Heartbeat) -> CreateVerdict:
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
                body["first_frame_image"] = await cloud_create.first_frame(
                    self.store, self.http, req.first_frame, FIRST_FRAME_MAX_BYTES, self.allow
                )
            except InputUnreadable as exc:
                return CreateVerdict(
                    outcome="refused",
                    attempts=0,
                    message=f"job {req.job_id}'s first frame: {exc}. Nothing was sent to "
                    "MiniMax and nothing was charged.",
                )
        t = self.client.timing
        loop = asyncio.get_running_loop()
        started, calls = loop.time(), 0
        backoff, rate_backoff = Backoff(t.backoff_s), Backoff(t.rate_limit_backoff_s)
        while True:
            calls += 1
            hb.update(Progress(phase="creating", value=calls), now=True)
            verdict = (await self.client.create(key, body)).model_copy(update={"attempts": calls})
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

    def ambiguous(self, req: CloudCreate, verdict: CreateVerdict) -> ApplicationError:
        task = f" (MiniMax named task {verdict.task_id})" if verdict.task_id else ""
        return ApplicationError(
            f"MiniMax create for job {req.job_id} is ambiguous ({verdict.message}): a charge "
            f"may exist{task}. MiniMax may have started a video task for the request sent at "
            f"{cloud_create.sent_when(verdict)}; check the usage and billing records in "
            f"{self.client.console()} for a video generation task created around then. "
            "spillway will not create again for this job; resubmit it only if MiniMax shows no "
            "such task.",
            cloud_create.ambiguous_details(req.job_id, verdict),
            type=AMBIGUOUS_CREATE,
            non_retryable=True,
        )
