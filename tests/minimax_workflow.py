"""Tiny workflows that run the MiniMax activities by their registered names, the way
VideoJobWorkflow does: the create never retried by Temporal, poll and download freely."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from spillway.minimax_models import (
        MiniMaxCreate,
        MiniMaxCreated,
        MiniMaxDone,
        MiniMaxDownload,
        MiniMaxPoll,
    )
    from spillway.models import Downloaded


class CreateOnceInput(BaseModel):
    create: MiniMaxCreate
    # False: RetryPolicy(maximum_attempts=1), as the real workflow runs it. True: Temporal's
    # default policy (unlimited attempts), to show the error itself forbids a second create.
    default_retry_policy: bool = False


HEARTBEAT = timedelta(seconds=30)
# Unlimited attempts: polling and downloading cost nothing.
FREE_RETRIES = RetryPolicy(initial_interval=timedelta(milliseconds=100))


@workflow.defn
class CreateOnce:
    @workflow.run
    async def run(self, inp: CreateOnceInput) -> MiniMaxCreated:
        policy = None if inp.default_retry_policy else RetryPolicy(maximum_attempts=1)
        created: MiniMaxCreated = await workflow.execute_activity(
            "minimax_create",
            inp.create,
            result_type=MiniMaxCreated,
            retry_policy=policy,
            start_to_close_timeout=timedelta(minutes=10),
            heartbeat_timeout=HEARTBEAT,
        )
        return created


@workflow.defn
class CloudOnce:
    @workflow.run
    async def run(self, req: MiniMaxCreate) -> Downloaded:
        created: MiniMaxCreated = await workflow.execute_activity(
            "minimax_create",
            req,
            result_type=MiniMaxCreated,
            retry_policy=RetryPolicy(maximum_attempts=1),
            start_to_close_timeout=timedelta(minutes=10),
            heartbeat_timeout=HEARTBEAT,
        )
        done: MiniMaxDone = await workflow.execute_activity(
            "minimax_poll",
            MiniMaxPoll(job_id=req.job_id, task_id=created.task_id),
            result_type=MiniMaxDone,
            retry_policy=FREE_RETRIES,
            start_to_close_timeout=timedelta(hours=2),
            heartbeat_timeout=HEARTBEAT,
        )
        downloaded: Downloaded = await workflow.execute_activity(
            "minimax_download",
            MiniMaxDownload(job_id=req.job_id, task_id=done.task_id, file_id=done.file_id),
            result_type=Downloaded,
            retry_policy=FREE_RETRIES,
            start_to_close_timeout=timedelta(hours=2),
            heartbeat_timeout=HEARTBEAT,
        )
        return downloaded
