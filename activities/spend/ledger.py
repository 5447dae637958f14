"""A client of the spend ledger for activities and the CLI (docs/design.md, "The spend ledger and
the budget"), reaching SpendLedgerWorkflow by its names: update-with-start for what may come
first (a reservation, a budget order), plain updates for `begin` and `settle`, a
query for the summary. Refusals come back
as SpendRefused with what stands in the way; a ledger that does not answer is tried a few times,
then reported (money fails closed: nothing is sent on a guess).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

from pydantic import SecretStr
from temporalio.api.enums.v1 import WorkflowExecutionStatus
from temporalio.client import (
    Client,
    RPCTimeoutOrCancelledError,
    WithStartWorkflowOperation,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.spend.history import archived_create
from spillway.core import names
from spillway.core.ledger import (
    BeginCreate,
    BudgetOrder,
    Budgets,
    BudgetShortfall,
    IncarnationAsk,
    LedgerInput,
    LedgerSummary,
    ReserveRequest,
    SettleRequest,
    SpendEntry,
)
from spillway.core.ledger_seal import sealed, signed_order
from spillway.core.spend_book import REFUSED, SpendRefused

log = logging.getLogger(__name__)
_T = TypeVar("_T")

# The ledger answers in milliseconds, but Temporal lets only a few updates be in flight on one
# workflow at once (history.maxInFlightUpdates, 10 by default) and refuses the rest with
# RESOURCE_EXHAUSTED: hundreds of jobs racing for the budget back off (jittered, growing) and try
# again. A worker that cannot get through for LEDGER_PATIENCE_S sends nothing; it stays below the
# reserve activity's start-to-close (1 min), so the activity's own retry takes over.
LEDGER_PATIENCE_S = 45.0
# A create's begin may wait longer: its activity heartbeats meanwhile and has 10 minutes, and
# giving up there fails the job (nothing sent) instead of retrying it.
BEGIN_PATIENCE_S = 300.0
LEDGER_IN_FLIGHT = 8  # updates one process has in flight on the ledger (the server allows 10)
LEDGER_PAUSES_S = (0.05, 2.0)  # the first pause, the longest
RPC_TIMEOUT = timedelta(seconds=10)
LEDGER_UNAVAILABLE = "SpendLedgerUnavailable"
LEDGER_CLOSED = "SpendLedgerClosed"
LEDGER_FOREIGN = "SpendLedgerForeign"


def ledger_closed(workflow_id: str) -> str:
    return (
        f"the spend ledger ({workflow_id}) was closed (terminated or failed) and is never started "
        "again empty: nothing was sent to any cloud provider; `spillway ledger restore` brings "
        "its entries back"
    )


class Ledger(Protocol):
    """What activities need of the ledger: `SpendLedger` (the workflow) in production; tests of
    a single activity may pass an in-process SpendBook behind the same five calls."""

    async def reserve(self, req: ReserveRequest) -> SpendEntry: ...
    async def begin(self, req: BeginCreate) -> SpendEntry: ...
    async def settle(self, req: SettleRequest) -> SpendEntry: ...
    async def configure(self, order: BudgetOrder | None = None) -> Budgets: ...
    async def summary(self) -> LedgerSummary | None: ...
    async def incarnation(self, workflow_id: str, run_id: str | None) -> str | None: ...
    async def check_home(self) -> None: ...
    async def created_before(self, job_id: str, incarnation: str | None) -> bool: ...
    async def archived_create(self, job_id: str, incarnation: str | None) -> SpendEntry | None: ...


class SpendLedger:
    """A client of SpendLedgerWorkflow (update-with-start for what may come first)."""

    def __init__(
        self, client: Client, task_queue: str, *, seal_with: SecretStr | None = None
    ) -> None:
        """`seal_with`: SPILLWAY_LEDGER_SECRET, which seals the input of a ledger this starts."""
        self._client, self._task_queue = client, task_queue
        self._seal_with = seal_with
        self.workflow_id = names.ledger_id(task_queue)
        # Queued here, in order, rather than refused by the server and retried: a burst of
        # hundreds of jobs then costs the server LEDGER_IN_FLIGHT calls at a time, not a storm.
        self._in_flight = asyncio.Semaphore(LEDGER_IN_FLIGHT)

    async def reserve(self, req: ReserveRequest) -> SpendEntry:
        return await self._call(
            lambda: self._client.execute_update_with_start_workflow(
                names.LEDGER_RESERVE,
                req,
                start_workflow_operation=self._start(),
                rpc_timeout=RPC_TIMEOUT,
                result_type=SpendEntry,
            )
        )

    async def begin(self, req: BeginCreate) -> SpendEntry:
        handle = self._client.get_workflow_handle(self.workflow_id)
        return await self._call(
            lambda: handle.execute_update(
                names.LEDGER_BEGIN, req, rpc_timeout=RPC_TIMEOUT, result_type=SpendEntry
            ),
            BEGIN_PATIENCE_S,
        )

    async def settle(self, req: SettleRequest) -> SpendEntry:
        handle = self._client.get_workflow_handle(self.workflow_id)
        return await self._call(
            lambda: handle.execute_update(
                names.LEDGER_SETTLE, req, rpc_timeout=RPC_TIMEOUT, result_type=SpendEntry
            )
        )

    async def configure(self, order: BudgetOrder | None = None) -> Budgets:
        """Sends a budget order (None: only asks for the budgets in force); the budgets in
        force come back. A refused order raises SpendRefused (kind BUDGET_ORDER_REFUSED)."""
        budgets: Budgets = await self._call(
            lambda: self._client.execute_update_with_start_workflow(
                names.LEDGER_CONFIGURE,
                order,
                start_workflow_operation=self._start(),
                rpc_timeout=RPC_TIMEOUT,
                result_type=Budgets,
            )
        )
        return budgets

    @property
    def identity(self) -> str:
        """Who this process is to Temporal (its pollers show the same)."""
        return self._client.identity

    async def order(
        self, budgets: Budgets, by: str, *, seed: bool = False, team: str | None = None
    ) -> Budgets:
        """New budgets, signed with SPILLWAY_LEDGER_SECRET (`seal_with`): `spillway budget`,
        or a worker's announce at start (`seed`), which only a budget never set takes. `team`:
        that team's budgets (the studio's stay as they are)."""
        if self._seal_with is None:
            raise ValueError("a budget order is signed with SPILLWAY_LEDGER_SECRET")
        secret = self._seal_with.get_secret_value()
        now = datetime.now(UTC)
        return await self.configure(
            signed_order(secret, self.workflow_id, budgets, by, now, seed=seed, team=team)
        )

    async def summary(self) -> LedgerSummary | None:
        """None when no ledger exists yet (nothing was ever reserved on this task queue)."""
        handle = self._client.get_workflow_handle(self.workflow_id)
        try:
            summary: LedgerSummary = await handle.query(
                names.LEDGER_SUMMARY, rpc_timeout=RPC_TIMEOUT, result_type=LedgerSummary
            )
            return summary
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return None
            raise

    async def created_before(self, job_id: str, incarnation: str | None) -> bool:
        handle = self._client.get_workflow_handle(self.workflow_id)
        ask = IncarnationAsk(job_id=job_id, incarnation=incarnation)
        created: bool = await handle.query(
            names.LEDGER_CREATED, ask, rpc_timeout=RPC_TIMEOUT, result_type=bool
        )
        return created

    async def archived_create(self, job_id: str, incarnation: str | None) -> SpendEntry | None:
        return await archived_create(self._client, self._task_queue, job_id, incarnation)

    async def closed_as(self) -> str | None:
        """How the ledger's latest run ended (TERMINATED, FAILED, ...); None while it runs."""
        info = (await self._client.get_workflow_handle(self.workflow_id).describe()).raw_description
        status = info.workflow_execution_info.status
        if status == WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING:
            return None
        return WorkflowExecutionStatus.Name(status).removeprefix("WORKFLOW_EXECUTION_STATUS_")

    async def check_home(self) -> None:
        """Refuses a ledger that runs on another task queue than spillway's: whoever started it
        there (before spillway did) would answer for it with their own code."""
        handle = self._client.get_workflow_handle(self.workflow_id)
        try:
            info = (await handle.describe(rpc_timeout=RPC_TIMEOUT)).raw_description
        except RPCError as exc:
            raise ApplicationError(
                f"the spend ledger ({self.workflow_id}) could not be read ({exc.message}): "
                "nothing was sent to any cloud provider",
                type=LEDGER_UNAVAILABLE,
            ) from None
        queue = info.workflow_execution_info.task_queue
        if queue != self._task_queue:
            raise ApplicationError(
                f"the spend ledger ({self.workflow_id}) runs on task queue {queue!r}, not "
                f"spillway's {self._task_queue!r}: it is not spillway's, and nothing was sent",
                type=LEDGER_FOREIGN,
                non_retryable=True,
            )

    async def incarnation(self, workflow_id: str, run_id: str | None) -> str | None:
        """A job's incarnation: the first run id of its execution (resets and continue-as-new
        keep it; a job id used again gets a new one)."""
        handle = self._client.get_workflow_handle(workflow_id, run_id=run_id)
        info = (await handle.describe(rpc_timeout=RPC_TIMEOUT)).raw_description
        return info.workflow_execution_info.first_run_id or None

    def _start(self) -> WithStartWorkflowOperation[Any, Any]:
        # Never started again empty once a ledger of this id closed (terminated, failed): its
        # entries are the only record of what was spent (`spillway ledger restore`).
        first = LedgerInput()
        if self._seal_with is not None:
            secret = self._seal_with.get_secret_value()
            first = sealed(secret, self.workflow_id, first, datetime.now(UTC))
        return WithStartWorkflowOperation(
            names.SPEND_LEDGER,
            first,
            id=self.workflow_id,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            task_queue=self._task_queue,
            static_summary="spillway spend ledger: every cloud create and the budgets",
        )

    async def _call(
        self, call: Callable[[], Awaitable[_T]], patience_s: float = LEDGER_PATIENCE_S
    ) -> _T:
        """Refusals become SpendRefused; a ledger that is busy or unreachable is tried again.
        Every call is idempotent for one run (a repeated reservation or begin gets its entry
        back), so asking again is safe."""
        give_up = time.monotonic() + patience_s
        pause, longest = LEDGER_PAUSES_S
        while True:
            try:
                async with self._in_flight:
                    return await call()
            except WorkflowAlreadyStartedError:
                raise ApplicationError(
                    ledger_closed(self.workflow_id), type=LEDGER_CLOSED, non_retryable=True
                ) from None
            except WorkflowUpdateFailedError as err:
                if _is_refusal(err):
                    raise _refusal(err) from None
                # Not the ledger's "no" (e.g. UnprocessedUpdate: the server dropped the update
                # before the ledger's worker saw it): nothing was recorded.
                why, busy = str(err.cause or err), False
            except (RPCError, RPCTimeoutOrCancelledError) as exc:
                if isinstance(exc, RPCError) and exc.status == RPCStatusCode.NOT_FOUND:
                    # An update to a ledger that closed (it exists: something was reserved).
                    raise ApplicationError(
                        ledger_closed(self.workflow_id), type=LEDGER_CLOSED, non_retryable=True
                    ) from None
                # Also what an update racing the ledger's continue-as-new gets.
                why = str(exc)
                busy = isinstance(exc, RPCError) and exc.status == RPCStatusCode.RESOURCE_EXHAUSTED
            if time.monotonic() + pause > give_up:
                raise ApplicationError(
                    f"the spend ledger ({self.workflow_id}) did not answer ({why}): "
                    "nothing was sent to any cloud provider",
                    type=LEDGER_UNAVAILABLE,
                ) from None
            if not busy:
                log.warning("spend ledger: %s; trying again", why)
            await asyncio.sleep(random.uniform(pause / 2, pause))  # noqa: S311 (jitter)
            pause = min(pause * 2, longest)


def _is_refusal(err: WorkflowUpdateFailedError) -> bool:
    return isinstance(err.cause, ApplicationError) and err.cause.type == REFUSED


def _refusal(err: WorkflowUpdateFailedError) -> SpendRefused:
    cause = err.cause
    assert isinstance(cause, ApplicationError)
    details = cause.details[0] if cause.details else {}
    entry = details.get("entry") if isinstance(details, dict) else None
    shortfall = details.get("shortfall") if isinstance(details, dict) else None
    return SpendRefused(
        cause.message,
        str(details.get("kind", "error")) if isinstance(details, dict) else "error",
        entry=SpendEntry.model_validate(entry) if entry else None,
        shortfall=BudgetShortfall.model_validate(shortfall) if shortfall else None,
    )
