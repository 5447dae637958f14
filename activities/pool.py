"""The GPU pool's activities (docs/design.md, "GPU admission"): the start of a pool that is not
running, by signal-with-start with the ask of the job that found none (a job signals a running
pool from its own workflow code); and the pool's check of the holders it has not heard from: a
holder that is closed, reset away or no longer holding this place gives it back."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from spillway import names
from spillway.gpu_pool import Holder, PoolAsk, PoolInput
from spillway.models import JobPlace

CHECKS_AT_ONCE = 16
ASK_TIMEOUT = timedelta(seconds=5)


class HolderCheck(BaseModel):
    holders: list[Holder]


class HoldersChecked(BaseModel):
    gone: list[str]  # job ids whose place is free again
    answered: list[str]  # job ids that still hold their place


class PoolActivities:
    def __init__(self, client: Client) -> None:
        self._client = client

    @activity.defn(name=names.POOL_START)
    async def start(self, ask: PoolAsk) -> None:
        """The pool of the job's task queue (the one this activity runs on); a running pool
        just takes the ask."""
        queue = activity.info().task_queue
        await self._client.start_workflow(
            names.GPU_POOL,
            PoolInput(),
            id=names.pool_id(queue),
            task_queue=names.pool_queue(queue),
            start_signal=names.POOL_ASK,
            start_signal_args=[ask],
        )

    @activity.defn(name=names.POOL_CHECK)
    async def check_holders(self, check: HolderCheck) -> HoldersChecked:
        limit = asyncio.Semaphore(CHECKS_AT_ONCE)

        async def held(holder: Holder) -> bool | None:
            async with limit:
                return await self._still_holds(holder)

        results = await asyncio.gather(*(held(h) for h in check.holders))
        return HoldersChecked(
            gone=[h.job_id for h, r in zip(check.holders, results, strict=True) if r is False],
            answered=[h.job_id for h, r in zip(check.holders, results, strict=True) if r],
        )

    async def _still_holds(self, holder: Holder) -> bool | None:
        """False: the place is free again; None: unknown now (asked again later, never freed on
        a guess: that could overbook the card)."""
        handle = self._client.get_workflow_handle(holder.job_id)
        try:
            described = await handle.describe(rpc_timeout=ASK_TIMEOUT)
            if described.status != WorkflowExecutionStatus.RUNNING:
                return False
            place = await handle.query(
                names.JOB_PLACE, result_type=JobPlace, rpc_timeout=ASK_TIMEOUT
            )
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            activity.logger.info("holder %s not checked: %s", holder.job_id, err)
            return None
        except Exception as err:  # a query the job could not answer now
            activity.logger.info("holder %s not checked: %s", holder.job_id, err)
            return None
        return place is not None and place.host == holder.host and place.asked_at == holder.asked_at
