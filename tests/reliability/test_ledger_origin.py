"""Who starts the spend ledger (issue 35, item 2; spillway/core/ledger_seal.py): with
SPILLWAY_LEDGER_SECRET on the workers, a ledger someone else started on spillway's queue, after
terminating spillway's, grants nothing whatever its input says, and `spillway health` names it;
`spillway ledger restore` then brings back what spillway's own run held, never what the intruder
chose. A real worker process on the session's dev server, creates counted at the MiniMax double.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from temporalio.client import Client, WorkflowHandle

from spillway.core import names
from spillway.core.ledger import LedgerInput
from spillway.core.ledger_seal import sealed
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.reliability.harness import cli
from tests.reliability.test_ledger_authority import ledger_started, replace_ledger
from tests.reliability.test_money import ledger
from tests.support.constants import BUSY_VRAM_PCT, CLIP_USD, LEDGER_SECRET
from tests.support.waiting import until

SECRET = LEDGER_SECRET


async def test_a_ledger_someone_else_started_grants_nothing_and_restore_skips_it(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim, sightings
):
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    worker = await workers(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        CLOUD_VIDEO_FALLBACK_ENABLED=1,
        SPILLWAY_LEDGER_SECRET=SECRET,
    )
    jobs = jobs_on(worker)
    await ledger_started(jobs.client, worker.task_queue)  # the worker's own, sealed
    # Started again as an operator's restore would, sealed, continuing as new after each create
    # (reserve, begin, settle): trust passes from run to run.
    ledger_id = names.ledger_id(worker.task_queue)
    workers_run = await current_run(jobs.client, ledger_id)
    short = LedgerInput(updates_per_run=3)
    short = sealed(SECRET, ledger_id, short, datetime.now(UTC), after=workers_run)
    first_run = await replace_ledger(jobs.client, worker.task_queue, short, "continues often")
    first = await jobs.submit("before the intruder")
    assert (await jobs.until(first, "completed")).route == "cloud"
    own_run = await until(lambda: current_run(jobs.client, ledger_id), lambda run: run != first_run)
    assert (await ledger(jobs.client, worker.task_queue)).untrusted is None

    # Someone who may start workflows: spillway's ledger terminated, theirs started with the
    # month's spending gone and a claim to be trusted.
    forged = LedgerInput(trusted=True, updates_per_run=3)
    await replace_ledger(jobs.client, worker.task_queue, forged, "an intruder")
    second = await jobs.submit("after the intruder")
    refused = await jobs.until(second, "failed")
    assert refused.error is not None and "not started by spillway" in refused.error
    assert minimax.create_calls == 1
    summary = await ledger(jobs.client, worker.task_queue)
    assert summary.untrusted is not None and "its input carries no seal" in summary.untrusted
    code, out, _ = await cli(sightings, "health", "--json", env=worker.env)
    assert "not started by spillway" in json.loads(out)["budget"]["error"], (code, out)

    await jobs.client.get_workflow_handle(ledger_id).terminate(reason="test: found out")
    code, out, err = await cli(sightings, "ledger", "restore", "--json", env=worker.env)
    assert code == 0, err
    restored = json.loads(out)
    assert restored["from_run"] == own_run and restored["closed_as"] == "TERMINATED"
    assert restored["spent_usd"] == CLIP_USD

    third = await jobs.submit("after the restore")
    assert (await jobs.until(third, "completed")).route == "cloud"
    assert minimax.create_calls == 2
    summary = await ledger(jobs.client, worker.task_queue)
    assert summary.untrusted is None and summary.day.spent_usd == 2 * CLIP_USD

    # The restore's sealed input is in its run's history: copied into a start of their own right
    # away (fresh), it follows the wrong run.
    restored_run = jobs.client.get_workflow_handle(ledger_id, run_id=restored["run_id"])
    copied = await first_input(jobs.client, restored_run)
    assert copied.seal is not None
    await replace_ledger(jobs.client, worker.task_queue, copied, "the intruder again")
    fourth = await jobs.submit("after the copy")
    refused = await jobs.until(fourth, "failed")
    assert refused.error is not None and "follows" in refused.error, refused.error
    assert minimax.create_calls == 2


async def first_input(client: Client, handle: WorkflowHandle[Any, Any]) -> LedgerInput:
    async for event in handle.fetch_history_events(page_size=1):
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        (inp,) = await client.data_converter.decode(payloads, [LedgerInput])
        assert isinstance(inp, LedgerInput)
        return inp
    raise AssertionError("no history")


async def current_run(client: Client, ledger_id: str) -> str:
    return (await client.get_workflow_handle(ledger_id).describe()).run_id or ""
