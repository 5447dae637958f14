"""The spend ledger under a race: N jobs reserve at once (update-with-start on one entity
workflow), then each begins and settles its create, as the CLOUD route does.

    .venv/bin/python bench/ledger.py [--jobs 300] [--budget-clips 10]

Prints reservations per second, reservation latency (p50, p99), and the same for a race that
a budget cuts off (most reservations refused by the update's validator, which writes nothing to
history). The server is the Temporal dev server; the ledger runs on an in-process worker.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

from temporalio.worker import Worker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from activities.spend.ledger import SpendLedger
from bench.common import run_main, start_dev_server
from spillway.spend_book import BeginCreate, Budgets, ReserveRequest, SettleRequest, SpendRefused
from workflows.spend_ledger import SpendLedgerWorkflow

CLIP = 0.28


async def race(ledger: SpendLedger, jobs: int, budget: float | None) -> dict[str, float]:
    latencies: list[float] = []
    granted = 0

    async def one(n: int) -> None:
        nonlocal granted
        job, run = f"bench-{n}", f"run-{n}"
        started = time.perf_counter()
        try:
            await ledger.reserve(
                ReserveRequest(
                    job_id=job,
                    run_id=run,
                    provider="minimax",
                    cost_usd=CLIP,
                    authorised_by="armed",
                    authorisation="armed",
                    budgets=Budgets(daily_usd=budget),
                )
            )
        except SpendRefused:
            latencies.append(time.perf_counter() - started)
            return
        latencies.append(time.perf_counter() - started)
        granted += 1
        await ledger.begin(BeginCreate(job_id=job, run_id=run))
        await ledger.settle(
            SettleRequest(job_id=job, run_id=run, state="charged", task_id=f"task-{n}")
        )

    started = time.perf_counter()
    await asyncio.gather(*(one(n) for n in range(jobs)))
    wall = time.perf_counter() - started
    latencies.sort()
    return {
        "granted": granted,
        "wall_s": wall,
        "per_s": jobs / wall,
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
    }


async def main(jobs: int, budget_clips: int) -> None:
    env = await start_dev_server()
    try:
        for label, budget in (
            ("no budget", None),
            (f"budget for {budget_clips} clips", budget_clips * CLIP + 1e-6),
        ):
            queue = f"bench-ledger-{uuid.uuid4()}"
            async with Worker(env.client, task_queue=queue, workflows=[SpendLedgerWorkflow]):
                figures = await race(SpendLedger(env.client, queue), jobs, budget)
                summary = await SpendLedger(env.client, queue).summary()
            assert summary is not None
            spent = summary.day.spent_usd
            print(
                f"{label:>22}: {jobs} racing reservations, {figures['granted']:.0f} granted, "
                f"{figures['per_s']:.0f}/s ({figures['wall_s']:.2f} s for all, begin and "
                f"settle included); reserve latency p50 {figures['p50_ms']:.0f} ms, "
                f"p99 {figures['p99_ms']:.0f} ms; ledger spent ${spent:.2f}",
                flush=True,
            )
    finally:
        await env.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--budget-clips", type=int, default=10)
    args = parser.parse_args()
    run_main(main(args.jobs, args.budget_clips))
