"""SpendLedgerWorkflow: the one owner of cloud spending (docs/design.md, "The spend ledger and the
budget").

A long-lived entity workflow, started on demand with update-with-start (never again once a ledger
of its id closed: `spillway ledger restore`). Its update handlers start no work: each validates,
puts its request in the inbox and waits for the answer. The run loop takes the inbox in arrival
order, vets the whole batch with one activity (activities/spend/vet.py: the request must come
from spillway's own job, running the activity that asks; the cost, the budgets and the job's
incarnation are what the ledger read itself, never what the request says; the budgets are the
book's own, changed only by a signed order the vet believed), then applies and
answers each request in order without another await, so "check the budget, then record" is
atomic however many jobs race. A regular activity's events replay the same however updates
interleave with it; a handler that awaited a local activity did not (0.4.0's wedged ledger,
docs/design.md, "Facts found while building"). It continues as new with the entries it still
needs. A run made by an operator's reset takes over what the run it was reset from held (the
vet's `reset`) before it applies anything.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Generic, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from activities.spend.vet import LedgerVetting, VetBatch, VetRequest
    from spillway.core import names
    from spillway.core.ledger import (
        BeginCreate,
        BudgetOrder,
        Budgets,
        IncarnationAsk,
        LedgerInput,
        LedgerSummary,
        ReserveRequest,
        SettleRequest,
        SpendEntry,
        Vetted,
    )
    from spillway.core.spend_book import REFUSED, SpendBook, SpendRefused

# Retried for a while (a describe the server cannot answer now), then the callers hear that the
# ledger did not answer and send nothing (they ask again).
VET_TIMEOUT = timedelta(seconds=30)
VET_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200), maximum_interval=timedelta(seconds=2)
)
CONTINUING = "SpendLedgerContinuing"  # not a refusal: asked again, it reaches the next run
UNVETTED = "SpendLedgerUnvetted"  # not a refusal: nothing was decided, asked again
UNSETTLED = "SpendLedgerUnsettled"  # not a refusal: turned away before acceptance, asked again
# Between the activations of two workflow tasks the history grows by 3 events at least
# (completed, scheduled, started). See `_open`.
_NEXT_TASK_AT_LEAST = 3

_Answer = TypeVar("_Answer", SpendEntry, Budgets)


@dataclass
class _Request(Generic[_Answer]):
    """A request in the inbox: what the vet is asked, and what the book does with its answer."""

    ask: VetRequest
    apply: Callable[[Vetted], _Answer]
    answer: _Answer | None = None
    error: ApplicationError | None = None
    done: bool = False


@workflow.defn(name=names.SPEND_LEDGER)
class SpendLedgerWorkflow:
    @workflow.init
    def __init__(self, inp: LedgerInput) -> None:
        self._book = SpendBook.of(inp)
        self._inbox: list[_Request[SpendEntry] | _Request[Budgets]] = []
        self._accepted = 0
        self._continuing = False
        # The run this one was reset from by an operator, known from a replayed answer of that
        # run (what it granted after the reset point is not in this run): it grants nothing
        # until the vet hands over what that run held (`_reset_held`).
        self._reset_from: str | None = None
        self._reset_held: str | None = None
        # Whether this run is one spillway made (the vet's word, spillway/core/ledger_seal.py): only
        # a trusted run hands trust on to the run it continues as. Until the vet has spoken, a
        # continued run holds what its predecessor handed on, any other nothing.
        self._trusted = inp.trusted is True and workflow.info().continued_run_id is not None
        self._untrusted: str | None = None  # why the vet refuses everything
        # The history length when the last vet answer (or failure) reached the run loop.
        self._answered_at: int | None = None

    @workflow.run
    async def run(self, inp: LedgerInput) -> None:
        def due() -> bool:
            return (
                self._accepted >= inp.updates_per_run
                or workflow.info().is_continue_as_new_suggested()
            )

        while not due():
            await workflow.wait_condition(lambda: bool(self._inbox) or due())
            if self._inbox:
                await self._serve()
        self._continuing = True  # new updates wait for the next run instead of starving this end
        while True:  # what was accepted before is answered here
            await workflow.wait_condition(
                lambda: bool(self._inbox) or workflow.all_handlers_finished()
            )
            if not self._inbox:
                break
            await self._serve()
        carried = self._book.carried(workflow.now(), inp.updates_per_run)
        workflow.continue_as_new(carried.model_copy(update={"trusted": self._trusted}))

    async def _serve(self) -> None:
        """One batch: vetted by one activity, then each request applied and answered in arrival
        order, with no await between the first check and the last record."""
        batch, self._inbox = self._inbox, []
        try:
            vetted = await workflow.execute_activity_method(
                LedgerVetting.vet,
                VetBatch(requests=[r.ask for r in batch], reset_held=self._reset_held),
                task_queue=names.vet_queue(workflow.info().task_queue),
                start_to_close_timeout=VET_TIMEOUT,
                schedule_to_close_timeout=timedelta(seconds=60),
                retry_policy=VET_RETRY,
            )
            answers = vetted.answers
            if vetted.reset is not None:
                # Made by a reset: the run it was reset from (and its successors) granted more
                # than this run's history holds. What they held replaces the book, before any
                # answer of this batch is applied.
                self._book = SpendBook.of(vetted.reset.held)
                self._reset_held, self._reset_from = vetted.reset.base_run, None
        except ActivityError as err:
            why = f"the spend ledger could not vet it ({err.cause or err}): nothing was decided"
            answers = [Vetted(failed=why)] * len(batch)
        self._answered_at = workflow.info().get_current_history_length()
        for request, terms in zip(batch, answers, strict=True):
            if request.ask.purpose != "terms":  # what changes the book counts towards its run's end
                self._accepted += 1
            try:
                # A copy: the book keeps changing its own entry after the answer left.
                request.answer = request.apply(self._judged(request.ask, terms)).model_copy()
            except SpendRefused as refused:
                request.error = _error(refused)
            except ApplicationError as err:
                request.error = err
            request.done = True
        self._publish_spend()

    def _publish_spend(self) -> None:
        """The day's spend for Prometheus, the studio's (`team="all"`) and each team's. Metrics
        are no commands: what a history holds is the same with them."""
        now = workflow.now()
        gauge = workflow.metric_meter().create_gauge_float(
            "spillway_cloud_spend_today_usd",
            "cloud spend of the UTC day, charged and maybe charged",
            "USD",
        )
        gauge.set(self._book.totals("day", now).spent_usd, {"team": "all"})
        for team in self._book.teams(now):
            gauge.set(self._book.totals("day", now, team).spent_usd, {"team": team})

    def _judged(self, ask: VetRequest, terms: Vetted) -> Vetted:
        """The terms, once the vet's answer allows the request at all."""
        if terms.failed is not None:
            raise ApplicationError(terms.failed, type=UNVETTED)
        if terms.ledger_run not in (None, workflow.info().run_id):
            # An answer recorded by the run this one was reset from, replayed: what it granted
            # stands, and everything after the reset point is unknown here until the vet hands
            # over what that run held.
            if self._reset_held is None:
                self._reset_from = terms.ledger_run
        elif self._reset_from is not None:
            raise SpendRefused(
                f"the spend ledger was reset (from run {self._reset_from}): it grants "
                "nothing until `spillway ledger restore` brings back what that run held; "
                "nothing was sent",
                "reset",
            )
        self._trusted = terms.ledger_trusted
        self._untrusted = None if terms.ledger_trusted else terms.refused
        if terms.refused is not None:
            raise SpendRefused(
                f"the spend ledger refuses this {ask.purpose}: {terms.refused}", terms.refused_kind
            )
        return terms

    async def _asked(self, request: _Request[_Answer]) -> _Answer:
        self._inbox.append(request)
        await workflow.wait_condition(lambda: request.done)
        if request.error is not None:
            raise request.error
        assert request.answer is not None
        return request.answer

    # --- queries ----------------------------------------------------------------------------

    @workflow.query(name=names.LEDGER_SUMMARY)
    def summary(self) -> LedgerSummary:
        now = workflow.now()
        carried = self._book.carried(now, LedgerInput().updates_per_run)
        summary = self._book.summary(now)
        summary.carried_bytes = len(carried.model_dump_json())
        summary.untrusted = self._untrusted
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

    # --- updates: each only queues its request -------------------------------------------------

    @workflow.update(name=names.LEDGER_RESERVE)
    async def reserve(self, req: ReserveRequest) -> SpendEntry:
        ask = VetRequest(
            purpose="reserve",
            job_id=req.job_id,
            run_id=req.run_id,
            provider=req.provider,
            authorisation=req.authorisation,
            authorised_by=req.authorised_by,
            team=req.team,
        )
        return await self._asked(
            _Request(ask, lambda terms: self._book.reserve(req, terms, workflow.now()))
        )

    @reserve.validator
    def _check_reserve(self, req: ReserveRequest) -> None:
        self._open()

    @workflow.update(name=names.LEDGER_BEGIN)
    async def begin(self, req: BeginCreate) -> SpendEntry:
        ask = VetRequest(
            purpose="begin",
            job_id=req.job_id,
            run_id=req.run_id,
            attempt=req.attempt,
            token=req.token,
        )
        return await self._asked(
            _Request(ask, lambda terms: self._book.begin(req, terms, workflow.now()))
        )

    @begin.validator
    def _check_begin(self, req: BeginCreate) -> None:
        self._open()

    @workflow.update(name=names.LEDGER_SETTLE)
    async def settle(self, req: SettleRequest) -> SpendEntry:
        ask = VetRequest(purpose="settle", job_id=req.job_id, run_id=req.run_id)
        return await self._asked(
            _Request(ask, lambda terms: self._book.settle(req, terms, workflow.now()))
        )

    @settle.validator
    def _check_settle(self, req: SettleRequest) -> None:
        self._open()

    @workflow.update(name=names.LEDGER_CONFIGURE)
    async def configure(self, order: BudgetOrder | None = None) -> Budgets:
        """A budget order (`spillway budget --day/--month`, or a worker's announce at start),
        taken once the vet found it signed with SPILLWAY_LEDGER_SECRET; without one, the
        budgets in force. Answers the budgets in force."""
        if order is None:
            ask = VetRequest(purpose="terms")
            return await self._asked(_Request(ask, lambda _: self._book.budgets))
        return await self._asked(
            _Request(VetRequest(purpose="budget", order=order), lambda _: self._ordered(order))
        )

    @configure.validator
    def _check_configure(self, order: BudgetOrder | None = None) -> None:
        self._open()

    def _ordered(self, order: BudgetOrder) -> Budgets:
        return self._book.set_budgets(order, workflow.now())

    def _open(self) -> None:
        if self._continuing:
            raise ApplicationError("the spend ledger is continuing as new", type=CONTINUING)
        # An update must never be accepted in a later activation than the vet answer it goes
        # out with. A legacy query task (a query the server handed straight to a worker while no
        # workflow task was pending) carries the events written until a worker polls it: core
        # applies the vet's result there, and the answers and the next vet wait to go out with
        # the workflow task that follows. An update that task brings is accepted after them; on
        # replay it comes in the same activation as the vet's result, is accepted before them,
        # and the history no longer replays ("UpdateMachine in state AcceptCommandCreated ...").
        # The tell: the vet answer came fewer events back than a workflow task boundary takes
        # (in one activation the validators run before the answer is applied). Turned away, the
        # update leaves nothing in the history (validators do not run on replay) and the caller
        # asks again.
        since = workflow.info().get_current_history_length() - (self._answered_at or 0)
        if self._answered_at is not None and since < _NEXT_TASK_AT_LEAST:
            raise ApplicationError(
                "the spend ledger has answers on their way out: nothing was decided, ask again",
                type=UNSETTLED,
            )


def _error(refused: SpendRefused) -> ApplicationError:
    details = {
        "kind": refused.kind,
        "entry": refused.entry.model_dump(mode="json") if refused.entry else None,
        "shortfall": refused.shortfall.model_dump(mode="json") if refused.shortfall else None,
    }
    return ApplicationError(refused.message, details, type=REFUSED, non_retryable=True)
