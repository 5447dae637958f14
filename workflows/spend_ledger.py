"""SpendLedgerWorkflow: the one owner of cloud spending (docs/design.md, "The spend ledger and the
budget").

A long-lived entity workflow, started on demand with update-with-start. Its updates run one at
a time, so "check the budget, then record the reservation" is atomic by construction however
many jobs race: each validator refuses what must not happen (a second create for a job, armed
spending the budget cannot cover) before anything is written to history, and the handler
records what did. It continues as new with the entries it still needs.
"""

from __future__ import annotations

from collections.abc import Callable

from temporalio import workflow
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from spillway import names
    from spillway.spend_book import (
        REFUSED,
        BeginCreate,
        Budgets,
        LedgerInput,
        LedgerSummary,
        ReserveRequest,
        SettleRequest,
        SpendBook,
        SpendEntry,
        SpendRefused,
    )


@workflow.defn(name=names.SPEND_LEDGER)
class SpendLedgerWorkflow:
    @workflow.init
    def __init__(self, inp: LedgerInput) -> None:
        self._book = SpendBook(inp.entries, inp.budgets)
        self._accepted = 0

    @workflow.run
    async def run(self, inp: LedgerInput) -> None:
        await workflow.wait_condition(
            lambda: (
                self._accepted >= inp.updates_per_run
                or workflow.info().is_continue_as_new_suggested()
            )
        )
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            LedgerInput(
                entries=self._book.kept(workflow.now()),
                budgets=self._book.budgets,
                updates_per_run=inp.updates_per_run,
            )
        )

    @workflow.query(name=names.LEDGER_SUMMARY)
    def summary(self) -> LedgerSummary:
        return self._book.summary(workflow.now())

    @workflow.query(name=names.LEDGER_BUDGETS)
    def budgets(self) -> Budgets:
        return self._book.budgets

    @workflow.update(name=names.LEDGER_RESERVE)
    def reserve(self, req: ReserveRequest) -> SpendEntry:
        return self._apply(lambda: self._book.reserve(req, workflow.now()))

    @reserve.validator
    def _check_reserve(self, req: ReserveRequest) -> None:
        _refuse_on(lambda: self._book.check_reserve(req, workflow.now()))

    @workflow.update(name=names.LEDGER_BEGIN)
    def begin(self, req: BeginCreate) -> SpendEntry:
        return self._apply(lambda: self._book.begin(req, workflow.now()))

    @begin.validator
    def _check_begin(self, req: BeginCreate) -> None:
        _refuse_on(lambda: self._book.check_begin(req, workflow.now()))

    @workflow.update(name=names.LEDGER_SETTLE)
    def settle(self, req: SettleRequest) -> SpendEntry:
        return self._apply(lambda: self._book.settle(req, workflow.now()))

    @settle.validator
    def _check_settle(self, req: SettleRequest) -> None:
        _refuse_on(lambda: self._book.check_settle(req, workflow.now()))

    @workflow.update(name=names.LEDGER_CONFIGURE)
    def configure(self, budgets: Budgets) -> Budgets:
        """Workers announce the budgets in force when they start (`spillway budget` shows them
        before any job has reserved)."""
        self._book.budgets = budgets
        return budgets

    def _apply(self, change: Callable[[], SpendEntry]) -> SpendEntry:
        # The validator ran just before with the same state, so this check cannot disagree;
        # it stays as the guard of the invariant should handlers ever interleave.
        self._accepted += 1
        try:
            return change().model_copy()
        except SpendRefused as refused:
            raise _error(refused) from None


def _refuse_on(check: Callable[[], object]) -> None:
    try:
        check()
    except SpendRefused as refused:
        raise _error(refused) from None


def _error(refused: SpendRefused) -> ApplicationError:
    details = {
        "kind": refused.kind,
        "entry": refused.entry.model_dump(mode="json") if refused.entry else None,
        "shortfall": refused.shortfall.model_dump(mode="json") if refused.shortfall else None,
    }
    return ApplicationError(refused.message, details, type=REFUSED, non_retryable=True)
