"""`python -m tests.support.kill_point_worker`: worker.py, with a power cut (SIGKILL of its own
process) at named points of a cloud create's life, each at most once across restarts, so a test
can make a kill land exactly there instead of hoping a timed kill does
(tests/reliability/test_create_kill_points.py).

`SPILLWAY_TEST_KILL_AT`: a comma-separated list of points; `SPILLWAY_TEST_KILL_MARKS`: a folder
where a point that fired leaves a file, so the restarted worker runs through it. The points:
- `before_begin`: the create activity runs, its ledger `begin` not sent;
- `after_begin`: the ledger granted the begin, the request not sent;
- `after_answer`: the provider's answer is read, the create's own settle not sent;
- `after_create_settle`: the create's own settle is recorded, its activity not completed;
- `after_job_settle`: the job's `spend_settle` (after a create whose worker was lost) is
  recorded, its activity not completed.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from activities.spend.activities import SpendActivities
from activities.spend.guard import CreateGuard, Send
from activities.spend.ledger import SpendLedger
from spillway.core.exits import leave
from spillway.core.ledger import BeginCreate, SettleRequest, SpendEntry, SpendSettle
from worker import main

POINTS = frozenset(filter(None, os.environ.get("SPILLWAY_TEST_KILL_AT", "").split(",")))
MARKS = Path(os.environ.get("SPILLWAY_TEST_KILL_MARKS", "."))


def cut(point: str) -> None:
    mark = MARKS / point
    if point in POINTS and not mark.exists():
        mark.write_text(point)
        os.kill(os.getpid(), signal.SIGKILL)


_begin, _settle = SpendLedger.begin, SpendLedger.settle
_create, _job_settle = CreateGuard.create, SpendActivities.settle


async def begin(self: SpendLedger, req: BeginCreate) -> SpendEntry:
    cut("before_begin")
    entry = await _begin(self, req)
    cut("after_begin")
    return entry


async def settle(self: SpendLedger, req: SettleRequest) -> SpendEntry:
    entry = await _settle(self, req)
    if req.nonce:  # the create's own settle; the job's carries no nonce unless it frees one
        cut("after_create_settle")
    return entry


async def create(self: CreateGuard, *args: Any) -> Any:
    job_id, authorisation, simulated, send, nonce = args

    async def answered() -> Any:
        verdict = await send()
        cut("after_answer")
        return verdict

    sent: Send = answered
    return await _create(self, job_id, authorisation, simulated, sent, nonce)


async def job_settle(self: SpendActivities, req: SpendSettle) -> SpendEntry | None:
    entry = await _job_settle(self, req)
    cut("after_job_settle")
    return entry


SpendLedger.begin = begin  # type: ignore[method-assign]
SpendLedger.settle = settle  # type: ignore[method-assign]
CreateGuard.create = create  # type: ignore[method-assign,assignment]
# The worker finds an activity's name on its function (@activity.defn's attribute).
DEFINITION = "__temporal_activity_definition"
setattr(job_settle, DEFINITION, getattr(_job_settle, DEFINITION))
SpendActivities.settle = job_settle  # type: ignore[method-assign]

if __name__ == "__main__":
    leave(asyncio.run(main()))
