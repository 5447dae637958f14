"""The sending side of a Kling create (activities.py runs it inside `CreateGuard`): sent,
sent again after a provable "not now" (1303, a token signed anew, no connection), and after an
unclear answer reconciled by the run's external_task_id (docs/design.md, "Kling facts"), all
within the timing's retry budget. It always returns a verdict the guard can settle: `created`
(with the task id), `refused` (provably nothing made), or `ambiguous` (a task may exist and
Kling has not said), even when the activity is cancelled part-way.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.cloud import provider as cloud_create
from activities.cloud.models import CloudCreate, CreateVerdict
from activities.cloud.provider import Backoff
from activities.heartbeat import Heartbeat
from activities.kling.client import KlingClient, KlingTiming
from activities.kling.errors import AMBIGUOUS_CREATE
from activities.kling.requests import Kind, kind_of
from spillway.core.models import Progress
from spillway.core.settings import shown

# What a person can do about a provable refusal, by Kling's code.
_WHAT_TO_DO = {
    1000: "check KLING_ACCESS_KEY and KLING_SECRET_KEY (one key pair from Kling's developer "
    "console) and the worker's clock",
    1001: "check KLING_ACCESS_KEY and KLING_SECRET_KEY on the worker",
    1002: "check that KLING_ACCESS_KEY and KLING_SECRET_KEY are one key pair from Kling's "
    "developer console",
    1003: "the worker's clock is ahead of Kling's: fix the time (NTP)",
    1100: "look at the account in Kling's developer console",
    1101: "the Kling account is in arrears: pay the outstanding bill",
    1102: "buy or renew a Kling resource pack",
}


@dataclass
class KlingCreator:
    """One job's create: sent, sent again after a provable "not now", reconciled by its
    external id after an unclear answer, all within the timing's retry budget."""

    client: KlingClient
    timing: KlingTiming
    job_id: str
    external: str
    hb: Heartbeat
    sent: int = 0  # create requests sent
    in_flight: bool = False
    unanswered: CreateVerdict | None = None  # the first create Kling may have got unanswered

    async def run(self, kind: Kind, body: dict[str, Any]) -> CreateVerdict:
        try:
            return await self._send(kind, body)
        except asyncio.CancelledError:
            # Worker shutdown past its grace: the outcome is settled, never left unsaid.
            if self.in_flight or self.unanswered is not None:
                return self._uncertain("the activity was cancelled while the create was under way")
            return CreateVerdict(
                outcome="refused",
                attempts=self.sent,
                message=f"the create for job {self.job_id} was cancelled before Kling accepted "
                "it: every try so far was refused before sending or answered 'not now', so no "
                "task was made and nothing was charged",
            )

    async def _send(self, kind: Kind, body: dict[str, Any]) -> CreateVerdict:
        t = self.timing
        loop = asyncio.get_running_loop()
        started = loop.time()
        backoff, rate_backoff = Backoff(t.backoff_s), Backoff(t.rate_limit_backoff_s)
        while True:
            self.sent += 1  # counted as it leaves: a cancellation mid-request still counts
            self.hb.update(Progress(phase="creating", value=self.sent), now=True)
            self.in_flight = True
            verdict = await self.client.create(kind, body)
            self.in_flight = False
            self.sent += verdict.attempts - 1  # a token re-signed is a second request
            verdict = verdict.model_copy(update={"attempts": self.sent})
            if verdict.outcome == "created":
                return verdict
            if verdict.outcome == "refused" and self.unanswered is None:
                return verdict
            if verdict.outcome in ("ambiguous", "refused"):
                # A task may exist (after a refused repeat: an earlier create may have made
                # one). Only Kling can say, by our external id.
                self.unanswered = self.unanswered or verdict
                found = await self._reconcile(kind, started)
                if found.outcome == "created":
                    return found.model_copy(
                        update={"attempts": self.sent, "sent_at": self.unanswered.sent_at}
                    )
                if found.outcome == "ambiguous":
                    return self._uncertain(found.message)
                if verdict.outcome == "refused":
                    return self._uncertain(
                        f"Kling refused the repeated create ({verdict.message}) and has no task "
                        f"for external_task_id {self.external} yet, but an earlier create went "
                        "unanswered"
                    )
                # Kling has no task for the id: send the same create again; whichever copy
                # arrives second cannot make a second task.
            delay = rate_backoff.next() if verdict.rate_limited else backoff.next()
            if loop.time() - started + delay > t.create_retry_budget_s:
                if self.unanswered is not None:
                    return self._uncertain(verdict.message)
                return verdict.model_copy(
                    update={
                        "outcome": "refused",
                        "message": f"Kling did not accept the create for job {self.job_id} "
                        f"after {self.sent} tries in {loop.time() - started:.0f}s (last: "
                        f"{verdict.message}). No task was made and nothing was charged: every "
                        "try was refused before sending or answered with an explicit 'not "
                        "now'. Resubmit the job later.",
                    }
                )
            activity.logger.warning(
                "Kling create for job %s not accepted (%s): trying again in %.1fs",
                self.job_id,
                verdict.message,
                delay,
            )
            self.hb.update(Progress(phase="create_backoff", value=self.sent), now=True)
            await asyncio.sleep(delay)

    async def _reconcile(self, kind: Kind, started: float) -> CreateVerdict:
        """`created` (Kling has the task), `retry` (it has none) or, when Kling gave no clear
        answer until the budget ended, `ambiguous`."""
        t = self.timing
        loop, backoff, tries = asyncio.get_running_loop(), Backoff(t.backoff_s), 0
        while True:
            tries += 1
            self.hb.update(Progress(phase="reconciling", value=tries), now=True)
            verdict = await self.client.reconcile(kind, self.external)
            if verdict.outcome != "ambiguous":
                return verdict
            delay = backoff.next()
            if loop.time() - started + delay > t.create_retry_budget_s:
                return verdict
            activity.logger.warning(
                "Kling create for job %s: %s; asking again in %.1fs",
                self.job_id,
                verdict.message,
                delay,
            )
            await asyncio.sleep(delay)

    def _uncertain(self, message: str) -> CreateVerdict:
        first = self.unanswered
        return CreateVerdict(
            outcome="ambiguous",
            code=first.code if first else None,
            message=message,
            sent_at=first.sent_at if first else None,
            attempts=self.sent,
        )


async def find_lost_create(
    client: KlingClient,
    timing: KlingTiming,
    kind: Kind,
    external: str,
    sent_at: float,
    hb: Heartbeat,
) -> str | None:
    """The task a create whose worker was lost made, by its kind and external_task_id, or None.
    "No task" is an answer only once none of the create's requests can still land (`sent_at`, a
    time.time(), plus the longest a create runs); until then Kling is asked again. Raises
    KlingError when Kling gives no answer."""
    settled_at = sent_at + timing.longest_create_s()
    backoff, tries = Backoff(timing.backoff_s), 0
    while True:
        tries += 1
        hb.update(Progress(phase="reconciling", value=tries), now=True)
        task = await client.query_external(kind, external)
        if task is not None:
            return task.task_id
        if (left := settled_at - time.time()) <= 0:
            return None
        await asyncio.sleep(min(backoff.next(), left))


def refused_message(job_id: str, verdict: CreateVerdict) -> str:
    code = verdict.code or 0
    todo = _WHAT_TO_DO.get(code, "look at the Kling account")
    return (
        f"Kling refused the create for job {job_id} ({verdict.message}): {todo}. Kling made no "
        "task and charged nothing; spillway hands the job to the next cloud provider, if any."
    )


def ambiguous(
    req: CloudCreate, verdict: CreateVerdict, external: str, base_url: str
) -> ApplicationError:
    base = shown(base_url).rstrip("/")
    return ApplicationError(
        f"Kling create for job {req.job_id} is ambiguous ({verdict.message}): a charge may "
        f"exist. The create sent at {cloud_create.sent_when(verdict)} carried external_task_id "
        f"{external}, and Kling has not said whether it made a task. Check with GET "
        f"{base}/v1/videos/{kind_of(req.request, req.first_frame is not None)}/{external} "
        "or in Kling's console (task list and resource pack usage). spillway will not create "
        "again for this job; resubmit it only if Kling shows no such task.",
        cloud_create.ambiguous_details(req.job_id, verdict, external_task_id=external),
        type=AMBIGUOUS_CREATE,
        non_retryable=True,
    )
