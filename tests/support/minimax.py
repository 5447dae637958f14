"""The CLOUD route's double and activities; loaded by conftest.

- `minimax`: the MiniMax double on loopback, expecting `CANARY_KEY`; its videos are
  `VIDEO_SIZE` bytes.
- `minimax_activities(timing=FAST, ledger=None, **overrides)`: MiniMaxActivities on
  `minimax_settings`, with `FAST` timing and a `BookLedger` (the real book-keeping, in process)
  that reserves a job on its first create.
- `FAST_WAITS`: the waits MiniMax's and Kling's FAST timings share; `cloud_activities`: the
  factory both providers' activity fixtures return.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx
import pytest

from activities.minimax.activities import MiniMaxActivities
from activities.minimax.client import MiniMaxTiming
from spillway.core.ledger import (
    BeginCreate,
    BudgetOrder,
    Budgets,
    LedgerSummary,
    ReserveRequest,
    SettleRequest,
    SpendEntry,
    Vetted,
)
from spillway.core.settings import Settings
from spillway.core.spend_book import SpendBook
from spillway.sim.minimax import MiniMaxSim
from tests.support.constants import CANARY_KEY, CLIP_USD
from tests.support.settings import SettingsFactory

A = TypeVar("A")
T = TypeVar("T")

VIDEO_SIZE = 300_000  # a few chunks, so the download streams and reports progress

# Production waits are seconds to minutes; the same logic runs here in milliseconds.
FAST_WAITS: dict[str, Any] = {
    "heartbeat_every_s": 0.05,
    "connect_timeout_s": 1.0,
    "request_timeout_s": 2.0,
    "create_retry_budget_s": 3.0,
    "backoff_s": (0.05,),
    "rate_limit_backoff_s": (0.3,),
    "poll_backoff_max_s": 1.0,
}
FAST = MiniMaxTiming(**FAST_WAITS, url_refreshes=3)


@pytest.fixture
async def minimax() -> AsyncIterator[MiniMaxSim]:
    async with MiniMaxSim(api_key=CANARY_KEY, video_size=VIDEO_SIZE) as sim:
        yield sim


@pytest.fixture
def minimax_activities(
    http: httpx.AsyncClient, minimax_settings: SettingsFactory
) -> Callable[..., MiniMaxActivities]:
    return cloud_activities(MiniMaxActivities, http, minimax_settings, FAST, BookLedger)


def cloud_activities(
    activities: Callable[[httpx.AsyncClient, Settings, BookLedger, T], A],
    http: httpx.AsyncClient,
    settings: SettingsFactory,
    fast: T,
    new_ledger: Callable[[], BookLedger],
) -> Callable[..., A]:
    """`make(timing=fast, ledger=None, **overrides)`: a provider's activities on
    `settings(**overrides)`, with a `new_ledger()` unless the test brings its own."""

    def make(timing: T = fast, ledger: BookLedger | None = None, **overrides: Any) -> A:
        return activities(http, settings(**overrides), ledger or new_ledger(), timing)

    return make


class BookLedger:
    """The spend ledger's rules (SpendBook) in this process, for tests of one activity outside a
    workflow. `begin` reserves a job it has never seen (approved, no budget, for `provider` at
    `cost_usd`) first, as the workflow's `spend_reserve` would have; everything else is the
    ledger's own answer."""

    def __init__(self, provider: str = "minimax", cost_usd: float = CLIP_USD) -> None:
        self.book = SpendBook([], Budgets())
        self.provider, self.cost_usd = provider, cost_usd

    async def reserve(self, req: ReserveRequest) -> SpendEntry:
        return self.book.reserve(req, self._terms(), datetime.now(UTC))

    async def begin(self, req: BeginCreate) -> SpendEntry:
        if not any(e.job_id == req.job_id for e in self.book.entries):
            await self.reserve(
                ReserveRequest(
                    job_id=req.job_id,
                    run_id=req.run_id,
                    provider=self.provider,
                    authorised_by="test",
                    authorisation="approved",
                )
            )
        return self.book.begin(req, self._terms(), datetime.now(UTC))

    async def settle(self, req: SettleRequest) -> SpendEntry:
        return self.book.settle(req, self._terms(), datetime.now(UTC))

    async def configure(self, order: BudgetOrder | None = None) -> Budgets:
        return self.book.budgets

    async def summary(self) -> LedgerSummary | None:
        return self.book.summary(datetime.now(UTC))

    async def incarnation(self, workflow_id: str, run_id: str | None) -> str | None:
        return None

    async def check_home(self) -> None:
        pass

    async def created_before(self, job_id: str, incarnation: str | None) -> bool:
        return self.book.created_before(job_id, incarnation)

    async def archived_create(self, job_id: str, incarnation: str | None) -> SpendEntry | None:
        return None

    def _terms(self) -> Vetted:
        return Vetted(cost_usd=self.cost_usd, budgets=self.book.budgets)

    def entry_of(self, job_id: str) -> SpendEntry | None:
        return next((e for e in reversed(self.book.entries) if e.job_id == job_id), None)

    def state_of(self, job_id: str) -> str | None:
        entry = self.entry_of(job_id)
        return entry.state if entry else None
