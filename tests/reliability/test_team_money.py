"""Team budgets under a race and a crash (issue 62, item 4): 300 armed jobs of three teams at once
(`SPILLWAY_TEAM_RACE_JOBS=300`; CI runs 90)
against a studio budget of 25 clips and team budgets of 8, 5 and 20 (seeded from the teams file),
while the one worker process (which also runs the spend ledger) is SIGKILLed in the middle and
started again. A real worker process on the session's dev server, creates counted at the MiniMax
double.

What holds, counted: each team's spend within its budget and the studio's within its own; at
most one create per job; the MiniMax double's creates are the ledger's charged entries, and at
most its charged plus maybe-charged (a kill between a create's begin and its request may leave a
maybe-charged entry that made nothing); every job the budgets turned away waits for a person,
its reasons naming the budget that is out.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections import Counter
from functools import partial
from pathlib import Path

import pytest
from temporalio.client import Client

from activities.spend.ledger import SpendLedger
from spillway.client import jobs as job_ops
from spillway.core.ledger import LedgerSummary
from spillway.core.models import CloudRequest, Plan, VideoJob
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.reliability.harness import assert_spend_covers, creates_of
from tests.reliability.test_money import count, ledger
from tests.support.constants import BUSY_VRAM_PCT, CLIP_USD
from tests.support.graphs import VIDEO_GRAPH
from tests.support.jobs import start_all
from tests.support.waiting import until, until_all

STUDIO_CLIPS = 25
TEAM_CLIPS = {"film": 8, "ads": 5, "games": 20}
# The 300 (100 a team): `SPILLWAY_TEAM_RACE_JOBS=300`. CI runs 90, as the GPU burst runs
# 200 of its thousand: the whole race beside the other reliability scenarios on 2 cores starved
# them (the ledger deploy scenario timed out in a clean clone's run).
PER_TEAM = int(os.environ.get("SPILLWAY_TEAM_RACE_JOBS", "90")) // 3
KILL_AFTER_CREATES = 5
LOST_CREATE = "a charge may exist"  # workflows/texts.py, every ambiguous create's words


def teams_file(tmp_path: Path) -> Path:
    path = tmp_path / "teams.json"
    teams = {
        name: {"share": 1 + n, "budget": {"day_usd": clips * CLIP_USD}}
        for n, (name, clips) in enumerate(TEAM_CLIPS.items())
    }
    path.write_text(json.dumps({"default": "film", "teams": teams}))
    return path


async def seeded(client: Client, task_queue: str) -> LedgerSummary:
    """The ledger once it holds every team's budget from the teams file (a worker announces
    them at its start)."""

    async def read() -> LedgerSummary | None:
        return await SpendLedger(client, task_queue).summary()

    def whole(summary: LedgerSummary | None) -> bool:
        return summary is not None and all(
            team in summary.teams and summary.teams[team].day.budget_usd is not None
            for team in TEAM_CLIPS
        )

    summary = await until(read, whole, timeout_s=60, what="the teams' budgets seeded")
    assert summary is not None
    return summary


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a backstop: `until_all` fails when the jobs stop settling
async def test_300_armed_jobs_of_three_teams_and_a_killed_worker_keep_every_budget(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim, tmp_path: Path
):
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    worker = await workers(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        CLOUD_VIDEO_FALLBACK_ENABLED=1,
        CLOUD_DAILY_BUDGET_USD=STUDIO_CLIPS * CLIP_USD,
        SPILLWAY_TEAMS_FILE=str(teams_file(tmp_path)),
        APPROVAL_TIMEOUT_S=3600,
        APPROVAL_RECHECK_S=3600,
        SPILLWAY_HEARTBEAT_TIMEOUT_S=30,
        MINIMAX_CREATE_TIMEOUT_S=30,
    )
    jobs = jobs_on(worker)
    client, queue = jobs.client, worker.task_queue
    await seeded(client, queue)
    ids = {
        team: [f"team-{team}-{n}-{uuid.uuid4().hex[:6]}" for n in range(PER_TEAM)]
        for team in TEAM_CLIPS
    }
    teams = {job_id: team for team, mine in ids.items() for job_id in mine}
    prompts = {job_id: f"race of teams {job_id}" for job_id in teams}

    async def submit(job_id: str) -> None:
        job = VideoJob(
            job_id=job_id,
            graph=VIDEO_GRAPH,
            cloud=CloudRequest(prompt=prompts[job_id]),
            team=teams[job_id],
        )
        await job_ops.submit(client, job, queue)
        assert jobs.started is not None
        jobs.started.append(job_id)

    # The teams' jobs interleaved, so that they race each other for the studio's budget.
    order = [ids[team][n] for n in range(PER_TEAM) for team in TEAM_CLIPS]
    starting = asyncio.create_task(start_all(partial(submit, job) for job in order))
    # Killed once creates are going out: reservations, begins and creates are in flight.
    await until(lambda: minimax.create_calls >= KILL_AFTER_CREATES, timeout_s=180, every_s=0.05)
    await worker.kill()
    await worker.start()
    await starting

    async def settled() -> int:
        states = ("completed", "awaiting_approval", "failed")
        return sum([await count(client, queue, state) for state in states])

    await until_all(settled, len(teams), what="the jobs settling")
    plans: list[Plan] = list(await asyncio.gather(*map(jobs.status, teams)))
    summary = await ledger(client, queue)

    creates = creates_of(minimax, prompts)
    assert max(creates.values()) <= 1, {j: n for j, n in creates.items() if n > 1}
    by_team = {team: 0 for team in TEAM_CLIPS}
    for job_id, made in creates.items():
        by_team[teams[job_id]] += made
    completed = [p.job_id for p in plans if p.state == "completed"]
    # A create the kill cut off between its begin and its answer: maybe charged, never re-sent.
    lost = [p.job_id for p in plans if p.state == "failed" and LOST_CREATE in (p.error or "")]
    waiting = [p for p in plans if p.state == "awaiting_approval"]
    assert summary.day.reserved_usd == 0
    # Charged and maybe-charged entries, whether still held or folded into the totals by a
    # continue-as-new: one clip each.
    spent_clips = round(summary.day.spent_usd / CLIP_USD)
    named = Counter(
        r.removeprefix("budget_exhausted_by=")
        for p in waiting
        for r in p.reasons
        if r.startswith("budget_exhausted_by=")
    )
    counts = (
        f"creates at MiniMax {minimax.create_calls} (tasks {minimax.tasks_created}), by team "
        f"{by_team}; jobs: {len(completed)} completed in the cloud (charged), {len(lost)} lost "
        f"their create to the kill (maybe charged, {sum(creates[j] for j in lost)} of them "
        f"reached MiniMax), {len(waiting)} wait for a person (the budget named: "
        f"{dict(sorted(named.items()))}); the ledger: studio spent "
        f"{summary.day.spent_usd:.2f} of {STUDIO_CLIPS * CLIP_USD:.2f} ({spent_clips} clips), "
        + ", ".join(
            f"{team} {summary.teams[team].day.spent_usd:.2f} of {clips * CLIP_USD:.2f}"
            for team, clips in TEAM_CLIPS.items()
        )
    )
    print(f"\nthe race of teams: {counts}")

    for team, clips in TEAM_CLIPS.items():
        assert summary.teams[team].day.spent_usd <= clips * CLIP_USD + 1e-6, counts
        assert by_team[team] <= clips, counts
    assert summary.day.spent_usd <= STUDIO_CLIPS * CLIP_USD + 1e-6, counts
    assert len(completed) + len(lost) + len(waiting) == len(plans), counts
    # The ledger's charged plus maybe charged are exactly the creates the double saw, but for a
    # lost create that never left (counted as a possible charge: money fails closed).
    assert spent_clips == len(completed) + len(lost), counts
    assert minimax.tasks_created == sum(creates.values()), counts
    # A lost create whose body the kill cut off reached MiniMax as a request and made no task.
    unread = len(lost) - sum(creates[j] for j in lost)
    assert minimax.tasks_created <= minimax.create_calls <= minimax.tasks_created + unread, counts
    assert minimax.tasks_created == len(completed) + sum(creates[j] for j in lost), counts
    assert_spend_covers(summary, minimax, plans)
    # The budgets, not the crash, stopped the spending: the studio's is spent but for what a
    # lost create may have left unclaimed.
    assert spent_clips >= STUDIO_CLIPS - len(lost), counts

    for plan in plans:
        if plan.state == "completed":
            assert plan.route == "cloud" and creates[plan.job_id] == 1
    for plan in waiting:
        assert creates[plan.job_id] == 0 and "budget_exhausted" in plan.reasons, plan.reasons
        said = [r for r in plan.reasons if r.startswith("budget_exhausted_by=")]
        team = teams[plan.job_id]
        assert said in (["budget_exhausted_by=studio"], [f"budget_exhausted_by=team:{team}"])
