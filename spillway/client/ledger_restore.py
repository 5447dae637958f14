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

from pydantic import BaseModel, SecretStr
from temporalio.api.enums.v1 import WorkflowExecutionStatus
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from activities.spend.history import not_made_by_spillway, rebuilt
from spillway.core import names
from spillway.core.errors import Failed
from spillway.core.ledger import LedgerInput
from spillway.core.ledger_seal import sealed
from spillway.core.spend_book import SpendBook


class Restored(BaseModel):
    """What `spillway ledger restore --json` prints."""

    ledger_id: str
    from_run: str | None  # None: started empty on purpose
    closed_as: str | None  # how that run ended: TERMINATED, FAILED, ...
    entries: int  # carried into the new ledger
    open_entries: int  # reserved, or maybe charged: what still blocks a second create
    spent_usd: float  # this month's charged and maybe charged, as the new ledger counts it
    run_id: str | None = None  # the new ledger's run
    sealed: bool = False  # its input sealed with SPILLWAY_LEDGER_SECRET


async def restore(
    client: Client,
    task_queue: str,
    *,
    empty: bool = False,
    seal_with: SecretStr | None = None,
    from_run: str | None = None,
) -> Restored:
    """`seal_with`: SPILLWAY_LEDGER_SECRET, without which workers that have one trust the
    restored ledger with nothing (spillway/core/ledger_seal.py); with it, the entries come from the
    newest run spillway made. `from_run`: from this closed run instead, whoever made it."""
    ledger_id = names.ledger_id(task_queue)
    closed = await _closed_run(client, ledger_id, empty)
    if closed is not None and from_run is not None:
        closed = await _chosen(client, ledger_id, from_run)
    elif closed is not None and not empty and seal_with is not None:
        closed = await _made_by_spillway(client, ledger_id, closed, seal_with.get_secret_value())
    held = LedgerInput()
    if closed is not None and not empty:
        held = await rebuilt(client, client.get_workflow_handle(ledger_id, run_id=closed[0]))
    now = datetime.now(UTC)
    book = SpendBook.of(held)
    if seal_with is not None:
        latest = await client.get_workflow_handle(ledger_id).describe() if closed else None
        after = latest.run_id if latest is not None else None
        held = sealed(seal_with.get_secret_value(), ledger_id, held, now, after)
    started = await client.start_workflow(
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
        run_id=started.result_run_id,
        sealed=held.seal is not None,
    )


async def _made_by_spillway(
    client: Client, ledger_id: str, latest: tuple[str, str], secret: str
) -> tuple[str, str]:
    """The newest run spillway made, from `latest` back: a run someone else started (it granted
    nothing) holds what they chose, not what was spent. Failed when there is none, e.g. every
    run predates SPILLWAY_LEDGER_SECRET."""
    runs = [latest]
    listed = [r async for r in client.list_workflows(f"WorkflowId = '{ledger_id}'")]
    for run in sorted(listed, key=lambda r: r.start_time, reverse=True):
        if run.run_id != latest[0] and run.status is not None:
            runs.append((run.run_id, run.status.name))
    skipped = []
    for run_id, how in runs:
        why = await not_made_by_spillway(client, ledger_id, run_id, secret)
        if why is None:
            return run_id, how
        skipped.append(f"{run_id} ({why})")
    raise Failed(
        f"no run of the spend ledger {ledger_id} was made by spillway, as SPILLWAY_LEDGER_SECRET "
        f"tells: {'; '.join(skipped)}. Runs from before the secret was set are unsealed: "
        "`spillway ledger restore --from-run RUN_ID` restores the one you trust"
    )


async def _chosen(client: Client, ledger_id: str, run_id: str) -> tuple[str, str]:
    try:
        described = await client.get_workflow_handle(ledger_id, run_id=run_id).describe()
    except RPCError as exc:
        if exc.status not in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
            raise
        raise Failed(f"--from-run: {ledger_id} has no run {run_id}") from None
    status = described.raw_description.workflow_execution_info.status
    if status == WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING:
        raise Failed(f"--from-run: run {run_id} of {ledger_id} is running")
    return run_id, WorkflowExecutionStatus.Name(status).removeprefix("WORKFLOW_EXECUTION_STATUS_")


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
