"""Fair share of the GPU places (docs/design.md, "A studio of several teams"): a team that asks
behind another's burst, with a real `python worker.py` (its agent in process), the doubles in a
process of their own and the Temporal dev server.

    .venv/bin/python bench/teams.py [--render-s 2] [--a 40] [--b 4] [--b-after-s 10]

Two places (A40_MAX_JOBS=2), renders of `--render-s` on the ComfyUI double. Team A submits `--a`
local jobs at once, team B `--b` more `--b-after-s` later. Prints B's admission wait (the job's
ask to the pool's answer giving it a place, from the pool's history), p50 and p95, with fair
share (a teams file of A and B, shares 1 and 1) beside strict arrival order (no teams file:
every job the one team), in one run: each on a task queue and a worker of its own, one after
the other, on the same dev server and doubles.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.backlog import count
from bench.common import run_main, start_dev_server, start_doubles, start_worker
from spillway.client.jobs import submit
from spillway.core import names
from spillway.core.models import VideoJob
from tests.support.graphs import VIDEO_GRAPH

SIGNALLED = EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED


def jobs(team: str, n: int, named: bool) -> list[VideoJob]:
    return [
        VideoJob(
            job_id=f"{team}-{i:03d}-{uuid.uuid4().hex[:6]}",
            graph=VIDEO_GRAPH,
            team=team if named else None,
        )
        for i in range(n)
    ]


async def admission_waits(client: Client, queue: str) -> dict[str, float]:
    """Per job, its ask to the answer that gave it a place, as the pool's history has them."""
    waits: dict[str, float] = {}
    async for event in client.get_workflow_handle(names.pool_id(queue)).fetch_history_events():
        if event.event_type != SIGNALLED:
            continue
        sent = event.signal_external_workflow_execution_initiated_event_attributes
        answer = json.loads(sent.input.payloads[0].data)
        if answer.get("host") is not None:
            asked = datetime.fromisoformat(answer["asked_at"].replace("Z", "+00:00"))
            at = event.event_time.ToDatetime().replace(tzinfo=UTC)
            waits[sent.workflow_execution.workflow_id] = (at - asked).total_seconds()
    return waits


async def one_arm(
    env: WorkflowEnvironment, urls: dict[str, str], args: argparse.Namespace, fair: bool
) -> list[float]:
    queue = f"teams-{uuid.uuid4()}"
    extra = {"A40_MAX_JOBS": "2"}
    if fair:
        teams = Path(tempfile.mkdtemp(prefix="spillway-teams-")) / "teams.json"
        teams.write_text(json.dumps({"default": "a", "teams": {"a": {}, "b": {}}}))
        extra["SPILLWAY_TEAMS_FILE"] = str(teams)
    worker = await start_worker(env, queue, urls, **extra)
    try:
        await asyncio.sleep(3)
        a, b = jobs("a", args.a, fair), jobs("b", args.b, fair)
        await asyncio.gather(*(submit(env.client, job, queue) for job in a))
        await asyncio.sleep(args.b_after_s)
        await asyncio.gather(*(submit(env.client, job, queue) for job in b))
        started = time.perf_counter()
        while await count(env.client, queue, "completed") < args.a + args.b:
            if time.perf_counter() - started > 60 + 2 * args.render_s * (args.a + args.b):
                raise SystemExit("the jobs never all completed")
            await asyncio.sleep(1)
        waits = await admission_waits(env.client, queue)
    finally:
        worker.kill()
    return [waits[job.job_id] for job in b]


def p50_p95(values: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[49], cuts[94]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--render-s", type=float, default=2.0)
    parser.add_argument("--a", type=int, default=40)
    parser.add_argument("--b", type=int, default=4)
    parser.add_argument("--b-after-s", type=float, default=10.0)
    args = parser.parse_args()
    env = await start_dev_server()
    sims, urls = await start_doubles(execution_s=args.render_s)
    try:
        strict = await one_arm(env, urls, args, fair=False)
        fair = await one_arm(env, urls, args, fair=True)
    finally:
        sims.kill()
        await env.shutdown()
    print(
        f"team A: {args.a} jobs at once, team B: {args.b} jobs {args.b_after_s:g} s later; "
        f"2 places (A40_MAX_JOBS=2), renders of {args.render_s:g} s"
    )
    for name, waits in (("strict arrival order", strict), ("fair share (1:1)", fair)):
        p50, p95 = p50_p95(waits)
        shown = ", ".join(f"{w:.1f}" for w in sorted(waits))
        print(f"  B's admission wait, {name:21}  p50 {p50:6.1f} s   p95 {p95:6.1f} s  ({shown})")


if __name__ == "__main__":
    run_main(main())
