"""Fixtures of the CLOUD route (MiniMax activities and double); loaded by conftest.

- `minimax`: the MiniMax double on loopback, expecting `CANARY_KEY`.
- `minimax_settings(**overrides)`: Settings pointing at it, with the canary key, short intervals
  and a per-test output folder.
- `minimax_activities(**overrides)`: MiniMaxActivities on those settings with `FAST` timing and
  a `BookLedger` (the real book-keeping, in process) that reserves a job on its first create.
- `run_activity(fn, arg)`: runs one activity in an ActivityEnvironment and returns
  `(result or exception, heartbeat details)`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.testing import ActivityEnvironment

from activities.minimax import MiniMaxActivities
from activities.minimax_client import MiniMaxTiming
from spillway.settings import Settings
from spillway.sim.minimax import MiniMaxSim
from spillway.spend_book import SpendBook
from spillway.spend_models import (
    BeginCreate,
    Budgets,
    LedgerSummary,
    ReserveRequest,
    SettleRequest,
    SpendEntry,
)

# Distinctive on purpose: finding it anywhere but in the double's expectation is a leak.
CANARY_KEY = "sk-spillway-CANARY-7f3a9c2e-do-not-log"
VIDEO_SIZE = 300_000  # a few chunks, so the download streams and reports progress

# Production waits are seconds to minutes; the same logic runs here in milliseconds.
FAST = MiniMaxTiming(
    heartbeat_every_s=0.05,
    connect_timeout_s=1.0,
    request_timeout_s=2.0,
    create_retry_budget_s=3.0,
    backoff_s=(0.05,),
    rate_limit_backoff_s=(0.3,),
    poll_backoff_max_s=1.0,
    url_refreshes=3,
)


@pytest.fixture
async def minimax() -> AsyncIterator[MiniMaxSim]:
    async with MiniMaxSim(api_key=CANARY_KEY, video_size=VIDEO_SIZE) as sim:
        yield sim


@pytest.fixture
def minimax_settings(minimax: MiniMaxSim, tmp_path: Path) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "MINIMAX_API_KEY": CANARY_KEY,
            "MINIMAX_BASE_URL": minimax.url,
            "MINIMAX_POLL_INTERVAL_S": 0.05,
            "MINIMAX_CREATE_TIMEOUT_S": 0.5,
            "SPILLWAY_OUTPUT_DIR": tmp_path / "outputs",
        }
        return Settings(**(values | overrides))

    return make


@pytest.fixture
def minimax_activities(
    http: httpx.AsyncClient, minimax_settings: Callable[..., Settings]
) -> Callable[..., MiniMaxActivities]:
    def make(
        timing: MiniMaxTiming = FAST, ledger: BookLedger | None = None, **overrides: Any
    ) -> MiniMaxActivities:
        return MiniMaxActivities(
            http, minimax_settings(**overrides), ledger or BookLedger(), timing
        )

    return make


class BookLedger:
    """The spend ledger's rules (SpendBook) in this process, for tests of one activity outside a
    workflow. `begin` reserves a job it has never seen (approved, no budget) first, as the
    workflow's `spend_reserve` would have; everything else is the ledger's own answer."""

    def __init__(self) -> None:
        self.book = SpendBook([], Budgets())

    async def reserve(self, req: ReserveRequest) -> SpendEntry:
        return self.book.reserve(req, datetime.now(UTC))

    async def begin(self, req: BeginCreate) -> SpendEntry:
        if not any(e.job_id == req.job_id for e in self.book.entries):
            await self.reserve(
                ReserveRequest(
                    job_id=req.job_id,
                    run_id=req.run_id,
                    provider="minimax",
                    cost_usd=0.28,
                    authorised_by="test",
                    authorisation="approved",
                    budgets=Budgets(),
                )
            )
        return self.book.begin(req, datetime.now(UTC))

    async def settle(self, req: SettleRequest) -> SpendEntry:
        return self.book.settle(req, datetime.now(UTC))

    async def configure(self, budgets: Budgets) -> None:
        self.book.budgets = budgets

    async def summary(self) -> LedgerSummary | None:
        return self.book.summary(datetime.now(UTC))

    def state_of(self, job_id: str) -> str | None:
        entry = next((e for e in reversed(self.book.entries) if e.job_id == job_id), None)
        return entry.state if entry else None


async def eventually(condition: Callable[[], object], timeout_s: float = 5.0) -> None:
    """Waits until `condition()` is true (a request reached the double, say)."""
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"condition not met within {timeout_s}s")


RunActivity = Callable[[Callable[[Any], Awaitable[Any]], Any], Awaitable[tuple[Any, list[Any]]]]


@pytest.fixture
def run_activity() -> RunActivity:
    async def run(fn: Callable[[Any], Awaitable[Any]], arg: Any) -> tuple[Any, list[Any]]:
        heartbeats: list[Any] = []
        env = ActivityEnvironment()
        env.on_heartbeat = lambda *details: heartbeats.extend(details)
        try:
            result: Any = await env.run(fn, arg)
        except Exception as exc:
            result = exc
        return result, heartbeats

    return run
