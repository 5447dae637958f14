"""`spillway health` names a spend ledger whose workflow task fails and is retried ("wedged": a
nondeterminism error after a deploy, a bug in its code), which answers every update with
"Workflow Task in failed state" so no cloud job can run, and says the way back: terminate it,
start the new workers, `spillway ledger restore` (docs/operations.md, "Health").

The ledger is wedged on purpose on the real dev server: a worker on its task queue whose
SpendLedgerWorkflow raises a plain exception, which fails the workflow task (not the workflow)
again and again."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from temporalio import workflow
from temporalio.client import WorkflowHandle
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from spillway.cli.health import Health, ledger_remedy
from spillway.cli.render import render_health
from spillway.cli.wedged import wedged
from spillway.core import names
from spillway.core.ledger import LedgerInput
from tests.support.cli import spillway, temporal
from tests.support.waiting import until

BROKEN = "this release's SpendLedgerWorkflow cannot replay the ledger's history"


@workflow.defn(name=names.SPEND_LEDGER)
class WedgedLedger:
    """A ledger whose every workflow task fails, as after a deploy that does not replay it."""

    @workflow.run
    async def run(self, held: LedgerInput) -> None:
        raise RuntimeError(BROKEN)  # not a Temporal failure: the task fails and is retried


async def attempt(handle: WorkflowHandle[Any, Any]) -> int:
    """The attempt of the ledger's pending workflow task (0: none pending)."""
    return (await handle.describe()).raw_description.pending_workflow_task.attempt


async def test_health_names_a_wedged_ledger_and_the_way_back(
    dev_env: WorkflowEnvironment, cli_env, tmp_path
):
    client = dev_env.client
    queue = f"wedged-{tmp_path.name[-24:]}"
    ledger_id = names.ledger_id(queue)
    env = cli_env(
        TEMPORAL_ADDRESS=client.service_client.config.target_host, SPILLWAY_TASK_QUEUE=queue
    )
    handle = client.get_workflow_handle(ledger_id)
    try:
        async with Worker(
            client,
            task_queue=queue,
            workflows=[WedgedLedger],
            workflow_runner=UnsandboxedWorkflowRunner(),  # its own code, in this test's module
        ):
            started = await client.start_workflow(
                WedgedLedger.run, LedgerInput(), id=ledger_id, task_queue=queue
            )
            await until(lambda: attempt(started), lambda a: a > 1, timeout_s=120, every_s=0.2)
        code, out, err = await spillway("health", "--json", env=env)

        assert code == 0, err  # health reports what is down and exits 0 (docs/operations.md)
        budget = json.loads(out)["budget"]
        assert {"daily_usd", "monthly_usd", "day", "month", "error", "warning"} <= set(budget)
        found = budget["wedged"]
        assert found["workflow_id"] == ledger_id
        assert found["run_id"] == started.result_run_id
        assert found["attempt"] >= 2
        assert found["cause"] == "WORKFLOW_WORKER_UNHANDLED_FAILURE"
        assert found["failure"] == BROKEN
        assert found["failing_since"] is not None
        assert found["remedy"] == ledger_remedy(ledger_id)
        error = budget["error"]
        for said in (
            f"the spend ledger ({ledger_id}, run {started.result_run_id}) is wedged",
            f"attempt {found['attempt']}",
            BROKEN,
            "no cloud job can run",
            f"`temporal workflow terminate --workflow-id {ledger_id}`",
            "start the new workers",
            "`spillway ledger restore`",
        ):
            assert said in error, (said, error)
        text = render_health(Health.model_validate_json(out))
        assert f"ledger: the spend ledger ({ledger_id}, run" in text

        # The way back it names works: terminate with the temporal CLI, then restore.
        await temporal(env, "workflow", "terminate", "--workflow-id", ledger_id)
        code, out, err = await spillway("ledger", "restore", "--json", env=env)
        assert code == 0, err
        restored = json.loads(out)
        assert (restored["from_run"], restored["closed_as"]) == (
            started.result_run_id,
            "TERMINATED",
        )
        assert await wedged(client, ledger_id, ledger_remedy(ledger_id)) is None
    finally:
        # Not running: never started, or terminated above and not restored.
        with contextlib.suppress(RPCError):
            await handle.terminate(reason="test_health_wedged: done")
