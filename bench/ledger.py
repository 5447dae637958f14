"""The spend ledger at volume (docs/performance.md, "The spend ledger"):

1. 10,000 creates over 40 simulated days, through SpendBook as the ledger runs it (three updates
   per create: reserve, begin, settle; a continue-as-new every 2,000 updates): the size of what
   each continue-as-new carries, against Temporal's 2 MB payload limit.
2. A real ledger on the Temporal dev server, started with what the last of those carried, vetting
   every request (activities/spend/vet.py): jobs that are spillway's own VideoJobWorkflow runs,
   each reserving once from its `spend_reserve` activity, at a steady rate and all at once
   against a budget that covers only some; every grant is counted against that budget.

    .venv/bin/python bench/ledger.py [--creates 10000] [--steady 200] [--rate 20] [--race 300]

Prints the carried sizes (largest, last), the reserve latency p50 / p99 at the steady rate, the
race's latency and the time until every reservation was answered, and over-budget grants.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio import activity, workflow
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from activities.spend.ledger import SpendLedger
from activities.spend.vet import LedgerVetting
from bench.common import run_main, start_dev_server
from spillway.core import names
from spillway.core.ledger import (
    BeginCreate,
    Budgets,
    LedgerInput,
    ReserveRequest,
    SettleRequest,
    Vetted,
)
from spillway.core.models import CloudRequest, VideoJob
from spillway.core.settings import Settings
from spillway.core.spend_book import SpendBook, SpendRefused
from spillway.core.tiers import load_tiers
from workflows.spend_ledger import SpendLedgerWorkflow

PAYLOAD_LIMIT = 2 * 1024 * 1024
UPDATES_PER_RUN = LedgerInput().updates_per_run
GRAPH = {"1": {"class_type": "SaveVideo", "inputs": {}}}


def carried_sizes(creates: int, days: int) -> tuple[list[int], LedgerInput]:
    """Bytes of each continue-as-new's input while `creates` go through over `days`."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    step = timedelta(days=days) / creates
    book, updates, sizes = SpendBook([], Budgets(daily_usd=1000, monthly_usd=30000)), 0, []
    carried = LedgerInput()
    for n in range(creates):
        now = start + n * step
        job, run, terms = f"job-{n:06d}", str(uuid.uuid4()), Vetted(incarnation=str(uuid.uuid4()))
        terms.cost_usd, terms.budgets = 0.28, book.budgets
        ask = ReserveRequest(
            job_id=job, run_id=run, provider="minimax", authorised_by="armed", authorisation="armed"
        )
        book.reserve(ask, terms, now)
        book.begin(BeginCreate(job_id=job, run_id=run, attempt=f"{run}/7/1"), terms, now)
        task = f"{300_000_000_000_000_000 + n}"
        book.settle(
            SettleRequest(job_id=job, run_id=run, state="charged", task_id=task), terms, now
        )
        updates += 3
        if updates >= UPDATES_PER_RUN:
            carried = book.carried(now, UPDATES_PER_RUN)
            sizes.append(len(carried.model_dump_json()))
            book, updates = SpendBook.of(carried), 0
    return sizes, carried


@workflow.defn(name=names.VIDEO_JOB)
class BenchJob:
    """A job as the ledger sees one: a VideoJobWorkflow run on spillway's queue whose
    `spend_reserve` activity asks."""

    @workflow.run
    async def run(self, job: VideoJob) -> float:
        latency: float = await workflow.execute_activity(
            names.SPEND_RESERVE,
            job.job_id,
            start_to_close_timeout=timedelta(seconds=60),
            result_type=float,
        )
        return latency


class Reserving:
    def __init__(self, ledger: SpendLedger) -> None:
        self.ledger, self.granted, self.refused = ledger, 0, 0

    @activity.defn(name=names.SPEND_RESERVE)
    async def reserve(self, job_id: str) -> float:
        info = activity.info()
        started = time.perf_counter()
        try:
            await self.ledger.reserve(
                ReserveRequest(
                    job_id=job_id,
                    run_id=info.workflow_run_id or "",
                    provider="minimax",
                    authorised_by="armed",
                    authorisation="armed",
                )
            )
            self.granted += 1
        except SpendRefused:
            self.refused += 1
        return time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def main(creates: int, steady: int, rate: float, race: int) -> None:
    sizes, carried = carried_sizes(creates, 40)
    print(
        f"carried at each of {len(sizes)} continue-as-new ({creates} creates over 40 days): "
        f"largest {max(sizes) / 1024:.0f} KiB ({100 * max(sizes) / PAYLOAD_LIMIT:.1f} % of 2 MB), "
        f"last {sizes[-1] / 1024:.0f} KiB; {len(carried.entries)} open entries, "
        f"{sum(len(t.split()) for t in carried.created.values())} created tags",
        flush=True,
    )
    env = await start_dev_server()
    try:
        queue = f"bench-ledger-{uuid.uuid4()}"
        clips_in_budget = race // 3
        settings = Settings(
            SPILLWAY_TASK_QUEUE=queue,
            MINIMAX_API_KEY="bench-key",
            CLOUD_VIDEO_FALLBACK_ENABLED=True,
            CLOUD_DAILY_BUDGET_USD=None,
        )
        tiers = load_tiers(settings.SPILLWAY_ROUTING_TIERS)
        ledger = SpendLedger(env.client, queue)
        reserving = Reserving(ledger)
        vetting = LedgerVetting(env.client, settings, tiers)
        # What the ledger carried after 10,000 creates, now on the workers' own budgets.
        await env.client.start_workflow(
            SpendLedgerWorkflow.run, carried, id=ledger.workflow_id, task_queue=queue
        )
        async with (
            Worker(
                env.client,
                task_queue=queue,
                workflows=[SpendLedgerWorkflow, BenchJob],
                activities=[reserving.reserve],
                workflow_runner=UnsandboxedWorkflowRunner(),
            ),
            Worker(env.client, task_queue=names.vet_queue(queue), activities=[vetting.vet]),
        ):

            async def job(label: str, n: int) -> float:
                video = VideoJob(
                    job_id=f"{label}-{n}-{uuid.uuid4().hex[:6]}",
                    graph=GRAPH,
                    cloud=CloudRequest(prompt=f"bench {n}"),
                )
                latency: float = await env.client.execute_workflow(
                    BenchJob.run, video, id=video.job_id, task_queue=queue
                )
                return latency

            runs = []
            for n in range(steady):
                runs.append(asyncio.create_task(job("steady", n)))
                await asyncio.sleep(1 / rate)
            paced = await asyncio.gather(*runs)
            p50, p99 = 1000 * statistics.median(paced), 1000 * percentile(paced, 0.99)
            print(
                f"steady {rate:g}/s, {steady} reservations: p50 {p50:.0f} ms, p99 {p99:.0f} ms "
                f"({reserving.granted} granted)",
                flush=True,
            )

            # The race: a budget that covers a third of the jobs, read by the ledger itself.
            clip = 0.28
            budget = (reserving.granted + clips_in_budget) * clip + 1e-6
            vetting._settings = settings.model_copy(update={"CLOUD_DAILY_BUDGET_USD": budget})
            granted_before, started = reserving.granted, time.perf_counter()
            raced = await asyncio.gather(*(job("race", n) for n in range(race)))
            wall = time.perf_counter() - started
            granted = reserving.granted - granted_before
            summary = await ledger.summary()
            assert summary is not None
            over = max(0, granted - clips_in_budget)
            print(
                f"race: {race} at once, budget for {clips_in_budget}: {granted} granted, "
                f"{reserving.refused} refused; latency p50 {1000 * statistics.median(raced):.0f} "
                f"ms, p99 {1000 * percentile(raced, 0.99):.0f} ms, max "
                f"{1000 * max(raced):.0f} ms; all answered {wall:.2f} s after the first start; "
                f"over-budget grants {over}; ledger reserved ${summary.day.reserved_usd:.2f} of "
                f"${summary.day.budget_usd:.2f}",
                flush=True,
            )
    finally:
        await env.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--creates", type=int, default=10_000)
    parser.add_argument("--steady", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20)
    parser.add_argument("--race", type=int, default=300)
    args = parser.parse_args()
    run_main(main(args.creates, args.steady, args.rate, args.race))
