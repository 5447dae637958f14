"""`read_policy`: the worker's routing configuration, read by an activity so that every job's
history records what was in force when it was decided (armed or not, thresholds, timeouts)."""

from __future__ import annotations

import os
import socket

from pydantic import BaseModel
from temporalio import activity

from activities.cloud import registry as clouds
from spillway.core import names
from spillway.core.hosts import gpu_hosts, ref
from spillway.core.models import Policy
from spillway.core.settings import Settings
from spillway.core.teams import load_teams
from spillway.core.tiers import RoutingTiers

# Temporal's own default identity for this process's client: what `health` shows its pollers as.
WORKER = f"{os.getpid()}@{socket.gethostname()}"


class PolicyRequest(BaseModel):
    job_id: str


class PolicyActivities:
    def __init__(self, settings: Settings, tiers: RoutingTiers) -> None:
        self._settings, self._tiers = settings, tiers
        self._teams = load_teams(settings.SPILLWAY_TEAMS_FILE)

    @activity.defn(name=names.READ_POLICY)
    async def read_policy(self, req: PolicyRequest) -> Policy:
        s = self._settings
        providers = clouds.configured(s)
        # Each host's agent polls queues named after the queue this worker serves (the GPU
        # pool's own queue is named after it too).
        queue = activity.info().task_queue.removesuffix(names.POOL_SUFFIX)
        return Policy(
            fallback_enabled=s.CLOUD_VIDEO_FALLBACK_ENABLED,
            key_present=bool(providers),
            thresholds=s.thresholds,
            approval_timeout_s=s.APPROVAL_TIMEOUT_S,
            approval_recheck_s=s.APPROVAL_RECHECK_S,
            unreachable_confirm_s=s.UNREACHABLE_CONFIRM_S,
            unreachable_give_up_s=s.UNREACHABLE_GIVE_UP_S,
            host_lost_after_s=s.HOST_LOST_AFTER_S,
            comfyui_max_attempts=s.COMFYUI_MAX_ATTEMPTS,
            webhook_configured=s.APPROVAL_WEBHOOK_URL is not None,
            ui_url=str(s.SPILLWAY_UI_URL).rstrip("/"),
            await_loops_per_run=s.SPILLWAY_AWAIT_LOOPS_PER_RUN,
            heartbeat_timeout_s=s.SPILLWAY_HEARTBEAT_TIMEOUT_S,
            simulated=s.SPILLWAY_SIMULATED,
            hosts=[
                ref(queue, h.name, h.max_jobs, h.comfyui_url) for h in gpu_hosts(s, self._tiers)
            ],
            providers=providers,
            job_webhook_configured=s.JOB_WEBHOOK_URL is not None,
            approvals_signed=s.SPILLWAY_APPROVAL_SECRET is not None,
            ledger_sealed=s.SPILLWAY_LEDGER_SECRET is not None,
            pool_reprobe_s=s.SPILLWAY_POOL_REPROBE_S,
            pool_line_check_s=s.SPILLWAY_POOL_LINE_CHECK_S,
            pool_holder_check_s=s.SPILLWAY_POOL_HOLDER_CHECK_S,
            pool_signals_in_flight=s.SPILLWAY_POOL_SIGNALS_IN_FLIGHT,
            pool_aging_s=s.SPILLWAY_POOL_AGING_S,
            pool_prefer_warm=s.SPILLWAY_POOL_PREFER_WARM,
            preempt=s.SPILLWAY_PREEMPT,
            preempt_max_run_s=s.SPILLWAY_PREEMPT_MAX_RUN_S,
            team_shares=self._teams.shares(),
            default_team=self._teams.default,
            team_max_waiting=self._teams.max_waiting(),
            team_approvers={
                name: list(team.approvers)
                for name, team in self._teams.teams.items()
                if team.approvers is not None
            },
            stall_rule=True,
            job_quote=True,
            cloud_eta=True,
            overflow_after_s=s.CLOUD_OVERFLOW_AFTER_S,
            pool_ask_again_s=s.SPILLWAY_POOL_ASK_AGAIN_S,
            host_fit=True,
            budget_read=True,
            daily_budget_usd=s.CLOUD_DAILY_BUDGET_USD,
            monthly_budget_usd=s.CLOUD_MONTHLY_BUDGET_USD,
            worker=WORKER,
        )
