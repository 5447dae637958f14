"""`spillway ledger restore`: a spend ledger that closed (terminated, failed, timed out) is never
started again empty by a job (docs/design.md, "The spend ledger and the budget"); this brings
its entries back, or, told `--i-know-it-is-empty`, starts an empty one on purpose.

The entries are rebuilt from the closed run's own history, not by replaying it: the run's input
(what its predecessor carried across continue-as-new) and every update's recorded answer (each
reservation, begin and settle answers with the whole entry as it then stood), the last answer
for an entry winning. That reads the same whatever code wrote it, and it needs no worker.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel
from temporalio.api.enums.v1 import WorkflowExecutionStatus
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from activities.spend.history import rebuilt
from spillway import names
from spillway.errors import Failed
from spillway.spend_book import LedgerInput, SpendBook


class Restored(BaseModel):
    """What `spillway ledger restore --json` prints."""

    ledger_id: str
    from_run: str | None  # None: started empty on purpose
    closed_as: str | None  # how that run ended: TERMINATED, FAILED, ...
    entries: int  # carried into the new ledger
    open_entries: int  # reserved, or maybe charged: what still blocks a second create
    spent_usd: float  # this month's charged and maybe charged, as the new ledger counts it


async def restore(client: Client, task_queue: str, *, empty: bool = False) -> Restored:
    ledger_id = names.ledger_id(task_queue)
    closed = await _closed_run(client, ledger_id, empty)
    held = LedgerInput()
    if closed is not None and not empty:
        held = await rebuilt(client, client.get_workflow_handle(ledger_id, run_id=closed[0]))
    now = datetime.now(UTC)
    book = SpendBook.of(held)
    await client.start_workflow(
        names.SPEND_LEDGER,
        held,  # the state it closed in, entries and all: a reset job finds its entry
        id=ledger_id,
        task_queue=task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
        static_summary="spillway spend ledger: every cloud create and the budgets",
    )
    return Restored(
        ledger_id=ledger_id,
        from_run=None if empty or closed is None else closed[0],
        closed_as=None if closed is None else closed[1],
        entries=len(held.entries),
        open_entries=sum(1 for e in held.entries if e.state in ("reserved", "maybe_charged")),
        spent_usd=book.totals("month", now).spent_usd,
    )


async def _closed_run(client: Client, ledger_id: str, empty: bool) -> tuple[str, str] | None:
    """(run id, how it ended) of the ledger's latest run; Failed when it is running, or when
    there is none and the operator did not say that empty is meant."""
    try:
        described = await client.get_workflow_handle(ledger_id).describe()
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise
        if empty:
            return None
        raise Failed(
            f"no spend ledger {ledger_id} is known to this namespace (never started, or closed "
            "longer ago than its retention): nothing to restore; `spillway ledger restore "
            "--i-know-it-is-empty` starts an empty one"
        ) from None
    status = described.raw_description.workflow_execution_info.status
    if status == WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING:
        handle = client.get_workflow_handle(ledger_id)
        try:
            reset_from: str = await handle.query(names.LEDGER_RESET_FROM, result_type=str)
        except (RPCError, WorkflowQueryFailedError):
            reset_from = ""  # one whose tasks fail answers no query: terminated first
        if reset_from:
            # Reset by an operator: the run it was reset from holds everything it granted.
            await handle.terminate(reason="spillway ledger restore: the ledger had been reset")
            return reset_from, "RESET"
        raise Failed(
            f"the spend ledger {ledger_id} is running: nothing to restore (terminate a ledger that "
            "no longer answers first; its entries come back from that run)"
        )
    how = WorkflowExecutionStatus.Name(status).removeprefix("WORKFLOW_EXECUTION_STATUS_")
    return described.run_id or "", how
