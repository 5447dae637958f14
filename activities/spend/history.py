"""Reading the spend ledger's past from Temporal's histories, without replaying its code: what
one run of SpendLedgerWorkflow held when it ended (`rebuilt`: its input, and every update's
recorded answer, each reservation, begin and settle answering with the whole entry as it then
stood, the last answer for an entry winning), and the create of a job incarnation that an
earlier run settled (`archived_create`), whether a run is one spillway made
(`not_made_by_spillway`), and what a reset run must take over (`reset_base`,
`held_before_reset`). Used by `spillway ledger restore`, `spillway budget --month`,
`spend_recorded` for a job whose entry the ledger no longer holds, and the ledger's vet."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle, WorkflowHistoryEventFilterType
from temporalio.service import RPCError, RPCStatusCode

from spillway.core import names
from spillway.core.ledger import Budgets, LedgerInput, SpendEntry
from spillway.core.ledger_seal import why_not_sealed
from spillway.core.spend_book import recorded_create


async def not_made_by_spillway(
    client: Client, ledger_id: str, run_id: str, secret: str
) -> str | None:
    """Why a run of the ledger is not one spillway made (spillway/core/ledger_seal.py): its input
    neither carried on from a trusted run by continue-as-new nor sealed with `secret` just
    before it started. None when it is. Read off its first event, which nothing sent to the run
    can change."""
    handle = client.get_workflow_handle(ledger_id, run_id=run_id)
    async for first in handle.fetch_history_events(page_size=1):
        started = first.workflow_execution_started_event_attributes
        inp = LedgerInput()
        if started.input.payloads:
            (inp,) = await client.data_converter.decode(started.input.payloads, [LedgerInput])
        if started.continued_execution_run_id:
            if inp.trusted:
                return None
            return f"it continued from run {started.continued_execution_run_id}, not trusted"
        at = first.event_time.ToDatetime(tzinfo=UTC)
        why = why_not_sealed(secret, ledger_id, inp, at)
        if why is None and (before := await _run_before(client, ledger_id, at, inp)) != (
            inp.sealed_after
        ):
            why = (
                f"its input was sealed to follow run {inp.sealed_after or '(none)'}, but it "
                f"follows {before or 'no run'}: a seal copied from another start"
            )
        return why
    return "its history could not be read"


async def _run_before(
    client: Client, ledger_id: str, started_at: datetime, inp: LedgerInput
) -> str | None:
    """The ledger's run that started last before `started_at`; what `inp` was sealed to follow
    on a server that cannot list runs (the time-skipping test server), where the seal's time
    alone counts."""
    try:
        return await _listed_run_before(client, ledger_id, started_at)
    except RPCError as exc:
        if exc.status != RPCStatusCode.UNIMPLEMENTED:
            raise
        return inp.sealed_after


async def _listed_run_before(client: Client, ledger_id: str, started_at: datetime) -> str | None:
    earlier = [
        run
        async for run in client.list_workflows(f"WorkflowId = '{ledger_id}'")
        if run.start_time < started_at
    ]
    return max(earlier, key=lambda run: run.start_time).run_id if earlier else None


async def rebuilt(client: Client, handle: WorkflowHandle[Any, Any]) -> LedgerInput:
    """What one run of the ledger held when it ended: its input, with every entry as the run's
    last answer about it left it. A run made by a reset holds only what came before the reset
    point and after it: what the run it was reset from answered is read from that run too."""
    held = LedgerInput()
    by_key: dict[tuple[str, datetime], SpendEntry] = {}
    async for event in handle.fetch_history_events():
        base = _reset_from(event)
        if base:
            before = await rebuilt(client, client.get_workflow_handle(handle.id, run_id=base))
            by_key.update({(e.job_id, e.at): e for e in before.entries})
            held.spent, held.created = before.spent, before.created
            continue
        for payload in _answers(event):
            (value,) = await client.data_converter.decode([payload], [dict])
            if not isinstance(value, dict) or not value:
                continue
            if "updates_per_run" in value:  # the run's input: what it was carried
                held = LedgerInput.model_validate(value)
                by_key.update({(e.job_id, e.at): e for e in held.entries})
            elif set(value) <= set(Budgets.model_fields):  # a `configure`'s answer
                held.budgets = Budgets.model_validate(value)
            else:
                try:
                    entry = SpendEntry.model_validate(value)
                except ValidationError:
                    continue
                by_key[(entry.job_id, entry.at)] = entry
    held.entries = sorted(by_key.values(), key=lambda e: e.at)
    return held


async def reset_base(handle: WorkflowHandle[Any, Any]) -> str | None:
    """The run this run of the ledger was last reset from (None: it was not reset)."""
    base = None
    async for event in handle.fetch_history_events():
        base = _reset_from(event) or base
    return base


async def held_before_reset(
    client: Client, ledger_id: str, base_run: str, reset_run: str
) -> LedgerInput:
    """What the ledger held when the reset that made `reset_run` from `base_run` ended it: what
    the run it ended held. From the base on, that is the run a later reset made from a run of
    the chain (Temporal names the latest), else the run it continued as new into, until a run
    that went on into neither."""
    handle, seen = client.get_workflow_handle(ledger_id, run_id=base_run), {base_run}
    while True:
        described = (await handle.describe()).raw_description
        after = described.workflow_extended_info.reset_run_id
        if after in ("", reset_run):
            after = ""
            closing = WorkflowHistoryEventFilterType.CLOSE_EVENT
            async for event in handle.fetch_history_events(event_filter_type=closing):
                continued = event.workflow_execution_continued_as_new_event_attributes
                after = continued.new_execution_run_id
        if not after or after in seen:
            return await rebuilt(client, handle)
        handle = client.get_workflow_handle(ledger_id, run_id=after)
        seen.add(after)


def _reset_from(event: HistoryEvent) -> str:
    """The run a reset made this one from ("" for any other event)."""
    if not event.HasField("workflow_task_failed_event_attributes"):
        return ""
    failed = event.workflow_task_failed_event_attributes
    if failed.cause != WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_RESET_WORKFLOW:
        return ""
    return failed.base_run_id


def _answers(event: HistoryEvent) -> list[Payload]:
    if event.HasField("workflow_execution_started_event_attributes"):
        return list(event.workflow_execution_started_event_attributes.input.payloads)
    if event.HasField("workflow_execution_update_completed_event_attributes"):
        outcome = event.workflow_execution_update_completed_event_attributes.outcome
        if outcome.HasField("success"):
            return list(outcome.success.payloads)
    return []


async def ledger_runs(client: Client, task_queue: str) -> list[WorkflowHandle[Any, Any]]:
    """The ledger's runs Temporal still keeps, oldest first."""
    ledger_id = names.ledger_id(task_queue)
    runs = [r async for r in client.list_workflows(f"WorkflowId = '{ledger_id}'")]
    runs.sort(key=lambda r: r.start_time)
    return [client.get_workflow_handle(ledger_id, run_id=r.run_id) for r in runs]


async def archived_create(
    client: Client, task_queue: str, job_id: str, incarnation: str | None
) -> SpendEntry | None:
    """The create of this job incarnation that an earlier ledger run recorded, newest run first."""
    for run in reversed(await ledger_runs(client, task_queue)):
        found = recorded_create((await rebuilt(client, run)).entries, job_id, incarnation)
        if found is not None:
            return found
    return None
