"""The spillway worker: `python worker.py` (= `spillway worker`), and the GPU agents
(`spillway agent --host NAME`) (docs/design.md, "GPU hosts and agents").

The worker serves SPILLWAY_TASK_QUEUE: the workflows, the policy, the spend ledger's activities,
the approval webhook and the cloud create; the long cloud activities (poll, download) on
`<queue>-waits`, a slot pool of their own; the spend ledger's vetting on `<queue>-ledger-vet`
(only with SPILLWAY_LEDGER_SECRET) and the GPU pool on `<queue>-gpu-pool`, each with a Temporal
worker of its own. Unless told
`--no-agents` it also runs the agent of every configured GPU host in the same process, so one
machine stays one command.

An agent runs next to one GPU: its load probe (NVML reads the GPU of the machine it runs on),
submit and cancel on `<queue>-gpu-<host>`, and the long waits on ComfyUI and the downloads on
`<queue>-gpu-<host>-waits`, whose slots (SPILLWAY_MAX_WAITS) never hold up a probe or a create.
Several workers and agents may share their queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
from temporalio.client import Client
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import PollerBehaviorSimpleMaximum, UnsandboxedWorkflowRunner, Worker

from activities.cloud import registry as clouds
from activities.heartbeat import PROGRESS_EVERY_S
from activities.probe.nvml import GpuReader, NvmlReader
from activities.registry import Agent, QueueWork, main_work
from activities.spend.ledger import SpendLedger
from activities.spend.vet import budgets_of
from activities.storage.opening import open_output_store
from spillway.core import names
from spillway.core import search_attributes as sa
from spillway.core.errors import ConfigError
from spillway.core.exits import leave
from spillway.core.gpu_pool import PoolPlaces
from spillway.core.hosts import WAITS_SUFFIX, GpuHost, gpu_hosts
from spillway.core.ledger import Budgets
from spillway.core.settings import Settings, load_settings
from spillway.core.teams import load_teams
from spillway.core.tiers import RoutingTiers, load_tiers, shared_comfyui
from spillway.temporal import TemporalUnreachable, connect
from workflows.callback import CallbackWorkflow
from workflows.gpu_pool import GpuPoolWorkflow
from workflows.health import HealthWorkflow
from workflows.quote import QuoteWorkflow
from workflows.spend_ledger import SpendLedgerWorkflow
from workflows.video_job import VideoJobWorkflow

log = logging.getLogger("spillway.worker")

# How long a starting worker waits for the spend ledger to hear its budget settings before it
# says it polls (jobs started once it does meet the ledger's budget).
ANNOUNCE_WAIT_S = 10.0
WORKFLOWS = [VideoJobWorkflow, SpendLedgerWorkflow, HealthWorkflow, CallbackWorkflow, QuoteWorkflow]
POOL = GpuPoolWorkflow  # on a queue of its own (spillway.core.names.pool_queue)
REPLAYED = [*WORKFLOWS, POOL]  # what the recorded histories are replayed against
# No sandbox in production. Temporal's sandbox re-imports workflow modules per run to isolate
# their state (ours hold constants only: tests/test_workflow_modules.py), and even with them
# passed through it compiles and runs a code string for every activation and every command's
# payloads: a fifth of the worker's CPU per LOCAL job (bench/comfyui_route.py). Passed through,
# our modules saw the real `datetime` and `random` anyway; what keeps workflow code
# deterministic is the full sandbox of the replay test and the tests' own workers.
WORKFLOW_RUNNER = UnsandboxedWorkflowRunner()
# Fixed pollers, more than the SDK's five a queue and half of the workflow pollers (not one of
# five) for new workflows: a burst of new jobs waited for its first workflow task
# (bench/backlog.py), and a task that finds no poller waiting goes through the server's backlog.
# Autoscaled pollers lost tasks under load (docs/design.md, "Facts found while building").
POLLING: dict[str, Any] = {
    "workflow_task_poller_behavior": PollerBehaviorSimpleMaximum(20),
    "nonsticky_to_sticky_poll_ratio": 0.5,
    "activity_task_poller_behavior": PollerBehaviorSimpleMaximum(20),
}


def _heartbeat_throttle(work: QueueWork, settings: Settings) -> timedelta:
    """The SDK holds an activity's heartbeats back for 0.8 of its timeout, which leaves a busy
    server 6 s of 30 before a live create looks like a lost worker (and its job fails). Creates,
    submits and the rest beat every third of the timeout. A host's waits carry a render's
    progress to `status` and `watch` (read off the pending activity), so they reach the server
    within PROGRESS_EVERY_S of a change: a write per rendering prompt every 1.5 s at most, as
    many as the host's places (the GPU line holds the rest, with no activity)."""
    if work.task_queue.endswith(WAITS_SUFFIX):
        return timedelta(seconds=PROGRESS_EVERY_S)
    return timedelta(seconds=settings.SPILLWAY_HEARTBEAT_TIMEOUT_S / 3)


@contextlib.asynccontextmanager
async def serving(
    client: Client,
    settings: Settings,
    tiers: RoutingTiers,
    *,
    agents: bool = True,
    only_host: str | None = None,
    gpu: GpuReader | None = None,
) -> AsyncIterator[list[QueueWork]]:
    """Runs the Temporal workers for the worker (unless `only_host`: an agent alone) and the
    agents of every host (or `only_host`) until the block ends. The worker's budget settings are
    announced to the spend ledger before the block begins (`announce_budgets`)."""
    hosts = gpu_hosts(settings, tiers)
    if only_host is not None:
        hosts = [h for h in hosts if h.name == only_host]
    owned = None
    if gpu is None:
        gpu = owned = NvmlReader()
    # The store is closed after the Temporal workers stopped (the exit stack below ends first).
    async with open_output_store(settings) as store, httpx.AsyncClient() as http:
        works: list[QueueWork] = []
        running = {h.name: Agent.of(http, settings, h, gpu, store, client) for h in hosts}
        if not agents and only_host is None:
            running = {}
        if only_host is None:
            works = main_work(http, client, settings, tiers, store, WORKFLOWS, POOL)
        for host in hosts:
            if host.name in running:
                works += running[host.name].work(settings, host)
        workers = [
            Worker(
                client,
                task_queue=w.task_queue,
                workflows=w.workflows,
                activities=w.activities,
                max_concurrent_activities=w.max_activities,
                max_cached_workflows=settings.SPILLWAY_MAX_CACHED_WORKFLOWS,
                **POLLING,
                max_heartbeat_throttle_interval=_heartbeat_throttle(w, settings),
                workflow_runner=WORKFLOW_RUNNER,
                # On SIGTERM a create in flight gets this long to end; waits hand over at once.
                graceful_shutdown_timeout=timedelta(seconds=settings.SPILLWAY_SHUTDOWN_GRACE_S),
            )
            for w in works
        ]
        try:
            async with contextlib.AsyncExitStack() as stack:
                for w in workers:
                    await stack.enter_async_context(w)
                if only_host is None:
                    await _tell_the_pool(client, settings, tiers)
                    ledger = SpendLedger(
                        client,
                        settings.SPILLWAY_TASK_QUEUE,
                        seal_with=settings.SPILLWAY_LEDGER_SECRET,
                    )
                    announcing = asyncio.create_task(announce_budgets(ledger, settings))
                    stack.callback(announcing.cancel)
                    # A ledger busy with a burst (or held by a worker just lost) answers later:
                    # the worker serves meanwhile, and the announce goes on behind it.
                    await asyncio.wait({announcing}, timeout=ANNOUNCE_WAIT_S)
                yield works
        finally:
            for agent in running.values():
                await agent.comfyui.aclose()
            if owned is not None:
                owned.close()


async def _tell_the_pool(client: Client, settings: Settings, tiers: RoutingTiers) -> None:
    """A running GPU pool hears the places this worker's policy has: a deploy that changed
    A40_MAX_JOBS or the hosts reaches the line within seconds, not at the pool's next 5-minute
    policy read. No pool running: nothing to tell (the first ask starts one with this policy)."""
    places = PoolPlaces(places={h.name: h.max_jobs for h in gpu_hosts(settings, tiers)})
    pool = client.get_workflow_handle(names.pool_id(settings.SPILLWAY_TASK_QUEUE))
    try:
        await pool.signal(names.POOL_POLICY, places)
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            log.warning("the GPU pool was not told this worker's places: %s", err)


async def run_worker(
    settings: Settings,
    tiers: RoutingTiers,
    client: Client,
    *,
    agents: bool = True,
    only_host: str | None = None,
) -> None:
    longest = max(p.longest_create_s(settings) for p in clouds.PROVIDERS.values())
    if only_host is None and longest > settings.SPILLWAY_SHUTDOWN_GRACE_S:
        log.warning(
            "SPILLWAY_SHUTDOWN_GRACE_S=%g is shorter than the longest cloud create (%gs): a "
            "create still running when it ends is cut off and its job fails as ambiguous",
            settings.SPILLWAY_SHUTDOWN_GRACE_S,
            longest,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with serving(client, settings, tiers, agents=agents, only_host=only_host) as works:
        queues = ", ".join(repr(w.task_queue) for w in works)
        fewer_full_collections()
        gauge = None
        if only_host is None:
            ledger = SpendLedger(
                client, settings.SPILLWAY_TASK_QUEUE, seal_with=settings.SPILLWAY_LEDGER_SECRET
            )
            gauge = asyncio.create_task(_gauges(client, ledger))
        log.info("worker polling task queues %s", queues)
        await stop.wait()
        log.info(
            "shutting down: waits hand over now, a create in flight gets %gs to end",
            settings.SPILLWAY_SHUTDOWN_GRACE_S,
        )
        if gauge is not None:
            gauge.cancel()


def fewer_full_collections(after: int = 1000) -> None:
    """Python's cyclic GC scans every live object in a full collection: behind a backlog of
    1,000 jobs that stopped the whole worker for 0.15-0.35 s every 2-3 s while the heap grew
    (bench/backlog.py), right when new jobs decide. What start-up built lives as long as the
    process and is frozen out of the scans; full collections wait for `after` collections of the
    middle generation instead of 10 (minutes apart under load, not seconds), at the price of
    cyclic garbage kept longer: about 20 MB more RSS behind that backlog, and the workflows the
    SDK evicts from a full cache (a line longer than SPILLWAY_MAX_CACHED_WORKFLOWS) wait for a
    full collection: docs/performance.md, "What a waiting job costs". With 100 the 50 decisions
    behind that backlog took p99 4.11 s against 1.84 s (one run each)."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, after)


async def _gauges(client: Client, ledger: SpendLedger) -> None:
    """Every 30 s: `spillway_jobs_awaiting_approval` from Temporal's visibility, and
    `spillway_ledger_carried_bytes`, what the spend ledger would carry across its next
    continue-as-new (Temporal refuses payloads over 2 MiB by default; `health` warns too)."""
    meter = (client.service_client.config.runtime or Runtime.default()).metric_meter
    waiting = meter.create_gauge(
        "spillway_jobs_awaiting_approval", "jobs waiting for a person's decision"
    )
    carried = meter.create_gauge(
        "spillway_ledger_carried_bytes", "what the spend ledger carries across continue-as-new"
    )
    query = f"WorkflowType = 'VideoJobWorkflow' AND {sa.STATE.name} = 'awaiting_approval'"
    while True:
        try:
            waiting.set((await client.count_workflows(query)).count)
            summary = await ledger.summary()
            if summary is not None and summary.carried_bytes is not None:
                carried.set(summary.carried_bytes)
        except Exception as exc:  # a visibility or ledger hiccup must not stop the worker
            log.warning("reading the gauges failed: %s", exc)
        await asyncio.sleep(30)


async def announce_budgets(ledger: SpendLedger, settings: Settings) -> None:
    """Starts the spend ledger (sealed) if none runs, and offers it this worker's
    CLOUD_*_BUDGET_USD and each team's `budget` from the teams file, signed: each budget is taken
    only by a ledger where that budget was never set (the budget is the ledger's: `spillway
    budget [--team NAME] --day/--month` sets it). A worker without a budget setting offers
    nothing; one without the secret does nothing at all (it could neither sign nor seal, and a
    ledger it started would grant nothing). A failure only leaves a budget never set without
    one until a person sets it."""
    budgets = budgets_of(settings)
    teams = {
        name: Budgets(daily_usd=team.budget.day_usd, monthly_usd=team.budget.month_usd)
        for name, team in load_teams(settings.SPILLWAY_TEAMS_FILE).teams.items()
        if team.budget is not None
    }
    if settings.SPILLWAY_LEDGER_SECRET is None:
        if budgets != Budgets() or teams:
            log.warning(
                "spend ledger: CLOUD_*_BUDGET_USD or a team's budget is set but "
                "SPILLWAY_LEDGER_SECRET is not: this worker cannot announce them; set them with "
                "`spillway budget [--team NAME] --day`"
            )
        return
    by = f"worker {ledger.identity}"
    try:
        if budgets == Budgets():
            held = await ledger.configure()
        else:
            held = await ledger.order(budgets, by, seed=True)
        for name, wanted in teams.items():
            kept = await ledger.order(wanted, by, seed=True, team=name)
            if kept != wanted:
                log.warning(
                    "spend ledger: team %s's budget in the teams file (day %s, month %s) changes "
                    "nothing: the ledger's is in force (day %s, month %s; spillway budget --team)",
                    name,
                    wanted.daily_usd,
                    wanted.monthly_usd,
                    kept.daily_usd,
                    kept.monthly_usd,
                )
    except Exception as exc:
        log.warning("spend ledger: announcing the budgets failed: %s", exc)
        return
    if budgets != Budgets() and held != budgets:
        log.warning(
            "spend ledger: this worker's CLOUD_*_BUDGET_USD (day %s, month %s) changes nothing: "
            "the budget is the ledger's (day %s, month %s; spillway budget)",
            budgets.daily_usd,
            budgets.monthly_usd,
            held.daily_usd,
            held.monthly_usd,
        )


def _runtime(settings: Settings) -> Runtime | None:
    if settings.SPILLWAY_METRICS_PORT is None:
        return None
    address = f"0.0.0.0:{settings.SPILLWAY_METRICS_PORT}"
    return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=address)))


def own_comfyuis(settings: Settings, hosts: list[GpuHost]) -> None:
    """For a process that runs every host's agent: a loopback URL is this machine's, so two
    hosts at one are one ComfyUI (routing_tiers.json refuses any other URL shared)."""
    shared = shared_comfyui([(h.name, h.comfyui_url) for h in hosts], loopback=True)
    if shared is not None:
        raise ConfigError(
            f"routing tiers {settings.SPILLWAY_ROUTING_TIERS}: {shared}, and this worker runs "
            "both agents: give each its own ComfyUI, or run each agent on its GPU's machine "
            "(spillway worker --no-agents; spillway agent --host NAME)"
        )


async def main(*, agents: bool = True, only_host: str | None = None) -> int:
    """`python worker.py`, `spillway worker [--no-agents]`, `spillway agent --host NAME`."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
    what = "spillway agent" if only_host else "spillway worker"
    try:
        settings = load_settings()
        tiers = load_tiers(settings.SPILLWAY_ROUTING_TIERS)
        clouds.check(settings, tiers)  # an unknown provider stops it here, in one line
        if only_host is None:  # the worker serves the ledger's vet; an agent spends nothing
            clouds.check_ledger_secret(settings)
        load_teams(settings.SPILLWAY_TEAMS_FILE)  # a bad file stops it here, naming the field
        hosts = gpu_hosts(settings, tiers)
        names = [h.name for h in hosts]
        if only_host is not None and only_host not in names:
            raise ConfigError(f"no GPU host {only_host!r} in routing tiers; hosts: {names}")
        if agents and only_host is None:
            own_comfyuis(settings, hosts)
        client = await connect(_runtime(settings))
    except (ConfigError, TemporalUnreachable) as exc:
        print(f"{what}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    if settings.SPILLWAY_METRICS_PORT is not None:
        log.info("Prometheus metrics on :%d/metrics", settings.SPILLWAY_METRICS_PORT)
    await run_worker(settings, tiers, client, agents=agents, only_host=only_host)
    return 0


if __name__ == "__main__":
    # Not sys.exit: a worker that gave up (Temporal unreachable) crashed now and then in the
    # interpreter's shutdown ("PyGILState_Release ... finalizing", exit -6 instead of 1).
    leave(asyncio.run(main()))
