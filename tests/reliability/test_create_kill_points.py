"""A power cut at each point of a cloud create's life, made to land there on purpose
(tests/support/kill_point_worker.py), not hoped for by a timed kill (docs/design.md, "Money
invariants" 2 and 5; docs/reliability.md).

One armed job on a busy GPU, one worker process that also runs the spend ledger, SIGKILLed at the
point and started again. Whatever the point, what the job says and what the ledger counts agree:
- a create that provably never left is sent anew (the ledger released it) and the job completes;
- one that may have left ends the job saying a charge may exist, never sends again, and the
  ledger counts it as spent (`maybe_charged`) until the provider proves otherwise;
- one whose task the ledger holds is followed to the end.
And always: the ledger's spent plus reserved covers every task the provider made.

`after_job_settle` is the mechanism found behind the deploy scenario's one clip short
(tests/reliability/test_ledger_deploy.py): the job's own settle after a lost create released a
reservation that never began, its worker was killed before the activity completed, and the
retried settle was told "no open spend entry": the job failed saying a charge may exist while the
ledger, rightly, counted nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spillway.core.ledger import LedgerSummary
from spillway.core.models import Plan
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.reliability.harness import CHARGE_MAY_EXIST, Worker, assert_spend_covers
from tests.reliability.test_money import ledger
from tests.support.constants import BUSY_VRAM_PCT, CLIP_USD
from tests.support.jobs import Jobs
from tests.support.waiting import until


@dataclass(frozen=True)
class Point:
    kill_at: str  # kill_point_worker's points, comma-separated ("" : the test kills)
    state: str  # how the job ends
    tasks: int  # tasks the provider made
    spent_usd: float  # what the ledger counts as spent
    entries: tuple[str, ...]  # the job's ledger entries' states, oldest first
    says: str | None = None  # in the job's error
    hang: bool = False  # the provider makes the task and never answers; the test kills
    refuses: bool = False  # the provider provably refuses (no balance)


POINTS = {
    "before the begin": Point("before_begin", "completed", 1, CLIP_USD, ("released", "charged")),
    "between the begin and the request": Point(
        "after_begin", "failed", 0, CLIP_USD, ("maybe_charged",), CHARGE_MAY_EXIST
    ),
    "after the request, before the answer": Point(
        "", "failed", 1, CLIP_USD, ("maybe_charged",), CHARGE_MAY_EXIST, hang=True
    ),
    "after the answer, before the settle": Point(
        "after_answer", "failed", 1, CLIP_USD, ("maybe_charged",), CHARGE_MAY_EXIST
    ),
    "after the create's settle": Point(
        "after_create_settle", "completed", 1, CLIP_USD, ("charged",)
    ),
    "after a refusal's settle": Point(
        "after_create_settle", "failed", 0, 0.0, ("refused",), "refused", refuses=True
    ),
    "before the begin, then after the job's settle": Point(
        "before_begin,after_job_settle", "completed", 1, CLIP_USD, ("released", "charged")
    ),
}


@pytest.mark.parametrize("point", list(POINTS))
async def test_a_kill_at_each_point_of_a_create_leaves_the_job_and_the_ledger_agreeing(
    point: str,
    workers: Callable[..., Any],
    jobs_on: Callable[[Worker], Jobs],
    comfyui: ComfyUISim,
    minimax: MiniMaxSim,
    tmp_path: Path,
) -> None:
    case = POINTS[point]
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    if case.hang:
        minimax.fault_next_create("hang")
    if case.refuses:
        minimax.inject("create", 1008)
    marks = tmp_path / "kill-marks"
    marks.mkdir()
    worker: Worker = await workers(
        module="tests.support.kill_point_worker",
        SPILLWAY_TEST_KILL_AT=case.kill_at,
        SPILLWAY_TEST_KILL_MARKS=marks,
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        CLOUD_VIDEO_FALLBACK_ENABLED=1,
        APPROVAL_TIMEOUT_S=600,  # an armed job that waited for a person would be a finding
    )
    jobs = jobs_on(worker)
    job = await jobs.submit(f"killed {point}")
    fired = case.kill_at.split(",") if case.kill_at else []
    for kill in fired:
        # The worker killed itself there (the mark comes first): reaped, then started again.
        mark = marks / kill
        await until(mark.exists, timeout_s=120, what=f"{kill} hit")
        await worker.kill()
        await worker.start()
    if case.hang:
        await until(lambda: minimax.tasks_created >= 1, timeout_s=120, what="the task made")
        await worker.kill()
        minimax.release()
        await worker.start()
    plan: Plan = await jobs.finished(job, timeout_s=180)
    summary: LedgerSummary = await ledger(jobs.client, worker.task_queue)
    entries = [e for e in summary.entries if e.job_id == job]
    seen = (plan.state, plan.error, minimax.tasks_created, [e.model_dump_json() for e in entries])
    assert plan.state == case.state, seen
    if case.says is not None:
        assert case.says in (plan.error or ""), seen
    else:
        assert CHARGE_MAY_EXIST not in (plan.error or ""), seen
    assert minimax.tasks_created == case.tasks, seen
    assert tuple(e.state for e in entries) == case.entries, seen
    assert summary.day.spent_usd == pytest.approx(case.spent_usd), seen
    assert summary.day.reserved_usd == 0, seen
    assert_spend_covers(summary, minimax, [plan])
