"""SpendLedgerWorkflow: the one owner of cloud spending (docs/design.md, "The spend ledger and the
budget").

A long-lived entity workflow, started on demand with update-with-start (never again once a ledger
of its id closed: `spillway ledger restore`). Before it changes anything it vets the request
with its own activity (activities/spend/vet.py): the request must come from spillway's own
job, running the activity that asks, and the cost, the budgets and the job's incarnation are
what the ledger read itself, never what the request says. After that await, "check the budget,
then record" runs without another, so it is atomic however many jobs race. It continues as new
with the entries it still needs.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.spend.vet import LedgerVetting, Purpose, VetRequest
    from spillway import names
    from spillway.spend_book import (
        REFUSED,
        BeginCreate,
        Budgets,
        IncarnationAsk,
        LedgerInput,
        LedgerSummary,
        ReserveRequest,
        SettleRequest,
        SpendBook,
        SpendEntry,
        SpendRefused,
        Vetted,
    )

# Retried for a while (a describe the server cannot answer now), then the caller hears that the
# ledger did not answer and sends nothing.
VET_TIMEOUT = timedelta(seconds=20)
VET_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=2)
)
# A ledger run that began with its vetting as a local activity keeps it; a new run vets by an
# activity: an update that arrived while a local activity ran replayed in another order than it
# ran (workflows/activity_calls.py, read_policy).
VET_BY_ACTIVITY = "vet-by-activity"
CONTINUING = "SpendLedgerContinuing"  # not a refusal: asked again, it reaches the next run


@workflow.defn(name=names.SPEND_LEDGER)
class SpendLedgerWorkflow:
    @workflow.init
    def __init__(self, inp: LedgerInput) -> None:
        self._book = SpendBook.of(inp)
        self._accepted = 0
        self._continuing = False
        # The run this one was reset from by an operator (its answers after the reset point are
        # not in this run): it grants nothing until `spillway ledger restore`.
        self._reset_from: str | None = None

    @workflow.run
    async def run(self, inp: LedgerInput) -> None:
        await workflow.wait_condition(
            lambda: (
                self._accepted >= inp.updates_per_run
                or workflow.info().is_continue_as_new_suggested()
            )
        )
        self._continuing = True  # new updates wait for the next run instead of starving this end
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(self._book.carried(workflow.now(), inp.updates_per_run))

    @workflow.query(name=names.LEDGER_SUMMARY)
    def summary(self) -> LedgerSummary:
        now = workflow.now()
        carried = self._book.carried(now, LedgerInput().updates_per_run)
        summary = self._book.summary(now)
        summary.carried_bytes = len(carried.model_dump_json())
        return summary

    @workflow.query(name=names.LEDGER_MONTH)
    def month_spent(self, month: str) -> float:
        return self._book.month_spent(month)

    @workflow.query(name=names.LEDGER_RESET_FROM)
    def reset_from(self) -> str:
        """The run this one was reset from ("" when it was not reset)."""
        return self._reset_from or ""

    @workflow.query(name=names.LEDGER_CREATED)
    def created_before(self, ask: IncarnationAsk) -> bool:
        return self._book.created_before(ask.job_id, ask.incarnation)

    @workflow.query(name=names.LEDGER_BUDGETS)
    def budgets(self) -> Budgets:
        return self._book.budgets

    @workflow.update(name=names.LEDGER_RESERVE)
    async def reserve(self, req: ReserveRequest) -> SpendEntry:
        terms = await self._vet("reserve", req.job_id, req.run_id, req)
        return self._apply(lambda: self._book.reserve(req, terms, workflow.now()))

    @reserve.validator
    def _check_reserve(self, req: ReserveRequest) -> None:
        self._open()

    @workflow.update(name=names.LEDGER_BEGIN)
    async def begin(self, req: BeginCreate) -> SpendEntry:
        terms = await self._vet("begin", req.job_id, req.run_id)
        return self._apply(lambda: self._book.begin(req, terms, workflow.now()))

    @begin.validator
    def _check_begin(self, req: BeginCreate) -> None:
        self._open()

    @workflow.update(name=names.LEDGER_SETTLE)
    async def settle(self, req: SettleRequest) -> SpendEntry:
        terms = await self._vet("settle", req.job_id, req.run_id)
        return self._apply(lambda: self._book.settle(req, terms, workflow.now()))

    @settle.validator
    def _check_settle(self, req: SettleRequest) -> None:
        self._open()

    @workflow.update(name=names.LEDGER_CONFIGURE)
    async def configure(self, _ignored: Budgets | None = None) -> Budgets:
        """Re-reads the budgets in force off the workers' settings (workers ask when they
        start, so `spillway budget` shows them before anything was reserved). Whatever the
        request carries is ignored: budgets are the workers' to set."""
        terms = await self._vet("terms", "", "")
        self._book.budgets = terms.budgets
        return terms.budgets

    async def _vet(
        self, purpose: Purpose, job_id: str, run_id: str, req: ReserveRequest | None = None
    ) -> Vetted:
        ask = VetRequest(purpose=purpose, job_id=job_id, run_id=run_id)
        if req is not None:
            ask = ask.model_copy(
                update={
                    "provider": req.provider,
                    "authorisation": req.authorisation,
                    "authorised_by": req.authorised_by,
                }
            )
        timeouts: dict[str, Any] = {
            "start_to_close_timeout": VET_TIMEOUT,
            "schedule_to_close_timeout": timedelta(seconds=40),
            "retry_policy": VET_RETRY,
        }
        terms: Vetted
        if workflow.patched(VET_BY_ACTIVITY):
            queue = names.vet_queue(workflow.info().task_queue)
            terms = await workflow.execute_activity_method(
                LedgerVetting.vet, ask, task_queue=queue, **timeouts
            )
        else:
            terms = await workflow.execute_local_activity_method(LedgerVetting.vet, ask, **timeouts)
        if terms.ledger_run not in (None, workflow.info().run_id):
            # An answer recorded by the run this one was reset from, replayed: what it granted
            # stands, and everything after the reset point is unknown here.
            self._reset_from = terms.ledger_run
        elif self._reset_from is not None:
            raise _error(
                SpendRefused(
                    f"the spend ledger was reset (from run {self._reset_from}): it grants "
                    "nothing until `spillway ledger restore` brings back what that run held; "
                    "nothing was sent",
                    "reset",
                )
            )
        self._book.budgets = terms.budgets
        if terms.refused is not None:
            raise _error(
                SpendRefused(f"the spend ledger refuses this {purpose}: {terms.refused}", "foreign")
            )
        return terms

    def _open(self) -> None:
        if self._continuing:
            raise ApplicationError("the spend ledger is continuing as new", type=CONTINUING)

    def _apply(self, change: Callable[[], SpendEntry]) -> SpendEntry:
        self._accepted += 1
        try:
            return change().model_copy()
        except SpendRefused as refused:
            raise _error(refused) from None


def _error(refused: SpendRefused) -> ApplicationError:
    details = {
        "kind": refused.kind,
        "entry": refused.entry.model_dump(mode="json") if refused.entry else None,
        "shortfall": refused.shortfall.model_dump(mode="json") if refused.shortfall else None,
    }
    return ApplicationError(refused.message, details, type=REFUSED, non_retryable=True)
