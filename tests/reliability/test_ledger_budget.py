"""The budget belongs to the ledger (issue 59): real worker processes on the session's dev server,
creates counted at the MiniMax double.

- two cloud workers on one queue, one with CLOUD_DAILY_BUDGET_USD=0.28 (a clip) and one with no
  budget setting: ten armed jobs make one create, and `spillway budget` shows the ledger's 0.28
  and who set it, whichever worker vetted last;
- a worker without keys (and so without SPILLWAY_LEDGER_SECRET) on the same queue never vets:
  no job fails on its missing key;
- `spillway budget --day` sets the ledger's budget with a signed order; an unsigned one from a
  raw client, one signed with another secret, the same order sent again and an older one change
  nothing; without the secret the command exits 2 naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from temporalio.worker import Worker

from activities.registry import main_work
from activities.storage.opening import open_output_store
from spillway.core import names
from spillway.core.ledger import Budgets, LedgerSummary
from spillway.core.ledger_seal import signed_order
from spillway.core.models import FINAL_STATES
from spillway.core.tiers import load_tiers
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.reliability.harness import DevServer, Sightings, cli
from tests.reliability.test_ledger_authority import forged
from tests.reliability.test_money import ledger
from tests.support.constants import BUSY_VRAM_PCT, CLIP_USD, LEDGER_SECRET
from tests.support.jobs import Jobs
from tests.support.settings import make_settings
from tests.support.waiting import until
from worker import POLLING, POOL, WORKFLOWS


def cloud(comfyui: ComfyUISim, minimax: MiniMaxSim) -> dict[str, object]:
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    return {
        "COMFYUI_URL": comfyui.url,
        "MINIMAX_BASE_URL": minimax.url,
        "CLOUD_VIDEO_FALLBACK_ENABLED": 1,
        "APPROVAL_TIMEOUT_S": 3600,
    }


async def settled(jobs: Jobs, prompt: str) -> str:
    """A job submitted and waited for until it completed or waits for a person."""
    job = await jobs.submit(prompt)
    await jobs.until(job, lambda p: p.state in ("completed", "awaiting_approval", *FINAL_STATES))
    return job


async def shown_budget(sightings: Sightings, env: dict[str, str]) -> LedgerSummary:
    code, out, err = await cli(sightings, "budget", "--json", env=env)
    assert code == 0, err
    return LedgerSummary.model_validate(json.loads(out))


async def test_two_workers_one_with_a_budget_spend_only_the_ledgers_budget(
    workers, jobs_on, sightings: Sightings, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    capped = await workers(**cloud(comfyui, minimax), CLOUD_DAILY_BUDGET_USD=CLIP_USD)
    await workers(**cloud(comfyui, minimax), SPILLWAY_TASK_QUEUE=capped.task_queue)
    jobs = jobs_on(capped)

    # One after another, so that their reservations are vetted by either worker in turn.
    ids = [await settled(jobs, f"two workers {n}") for n in range(10)]

    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)
    shown = await shown_budget(sightings, capped.env)
    assert shown.day.budget_usd == CLIP_USD and shown.day.spent_usd == pytest.approx(CLIP_USD)
    assert shown.budget_set is not None and shown.budget_set.seed
    assert shown.budget_set.by.startswith("worker ")
    waiting = [p for p in await asyncio.gather(*map(jobs.status, ids)) if p.route is None]
    assert len(waiting) == 9 and all("budget_exhausted" in p.reasons for p in waiting)


async def test_a_worker_without_keys_on_the_queue_never_vets(
    workers, jobs_on, temporal_server: DevServer, comfyui: ComfyUISim, minimax: MiniMaxSim, tmp_path
):
    spender = await workers(**cloud(comfyui, minimax))
    queue = spender.task_queue
    # What a worker with no key (so no SPILLWAY_LEDGER_SECRET) serves of the ledger's vet queue,
    # beside the spender: its main queue would decide jobs by its own unarmed policy, which is
    # another matter.
    keyless = make_settings(
        SPILLWAY_TASK_QUEUE=queue,
        SPILLWAY_LEDGER_SECRET=None,
        SPILLWAY_OUTPUT_DIR=str(tmp_path / "keyless"),
    )
    client = temporal_server.client
    tiers = load_tiers(keyless.SPILLWAY_ROUTING_TIERS)
    jobs = jobs_on(spender)
    async with (
        open_output_store(keyless) as store,
        httpx.AsyncClient() as http,
        contextlib.AsyncExitStack() as stack,
    ):
        for work in main_work(http, client, keyless, tiers, store, WORKFLOWS, POOL):
            if work.task_queue == names.vet_queue(queue):
                await stack.enter_async_context(
                    Worker(
                        client, task_queue=work.task_queue, activities=work.activities, **POLLING
                    )
                )
        # One after another: each reservation is vetted by whichever vet poller takes it.
        plans = [await jobs.finished(await jobs.submit(f"keyless beside {n}")) for n in range(8)]

    assert [p.error for p in plans if p.state != "completed"] == []
    assert {(p.state, p.route) for p in plans} == {("completed", "cloud")}
    assert minimax.create_calls == 8


async def test_only_a_newer_signed_budget_order_changes_the_ledgers_budget(
    workers, jobs_on, sightings: Sightings, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    worker = await workers(**cloud(comfyui, minimax), CLOUD_DAILY_BUDGET_USD=CLIP_USD)
    client, queue = jobs_on(worker).client, worker.task_queue
    ledger_id = names.ledger_id(queue)
    await until(
        lambda: ledger(client, queue),
        lambda s: s.budget_set is not None,
        what="the worker's budget announced",
    )

    code, _, err = await cli(
        sightings,
        "budget",
        "--day",
        "1.5",
        "--month",
        "none",
        "--by",
        "ana",
        "--json",
        env=worker.env,
    )
    assert code == 0, err
    held = await ledger(client, queue)
    assert (held.day.budget_usd, held.month.budget_usd) == (1.5, None)
    assert held.budget_set is not None and (held.budget_set.by, held.budget_set.seed) == (
        "ana",
        False,
    )

    lots = Budgets(daily_usd=1000.0)
    unsigned = {"ledger_id": ledger_id, "budgets": {"daily_usd": 1000.0}, "by": "mallory"}
    now = datetime.now(UTC)
    other_secret = signed_order("x" * 32, ledger_id, lots, "mallory", now)
    # ana's very order, as anyone who reads the ledger's history can send it again
    same = Budgets(daily_usd=1.5)
    replayed = signed_order(LEDGER_SECRET, ledger_id, same, "ana", held.budget_set.issued_at)
    older = signed_order(
        LEDGER_SECRET, ledger_id, lots, "ana", held.budget_set.issued_at - timedelta(seconds=1)
    )
    refusals = [await forged(client, queue, names.LEDGER_CONFIGURE, unsigned)] + [
        await forged(client, queue, names.LEDGER_CONFIGURE, order.model_dump(mode="json"))
        for order in (other_secret, replayed, older)
    ]
    assert "not signed" in refusals[0] and "not the workers'" in refusals[1]
    assert "not newer" in refusals[2] and "not newer" in refusals[3]
    # A worker restarted with another setting announces it; the ledger has its budget already.
    await workers(**cloud(comfyui, minimax), SPILLWAY_TASK_QUEUE=queue, CLOUD_DAILY_BUDGET_USD=99)
    after = await ledger(client, queue)
    assert (after.day.budget_usd, after.month.budget_usd) == (1.5, None)
    assert after.budget_set == held.budget_set

    without = {k: v for k, v in worker.env.items() if k != "SPILLWAY_LEDGER_SECRET"}
    code, _, err = await cli(sightings, "budget", "--day", "7", "--by", "ana", env=without)
    assert code == 2 and "SPILLWAY_LEDGER_SECRET" in err and len(err.strip().splitlines()) == 1
    assert (await ledger(client, queue)).day.budget_usd == 1.5
