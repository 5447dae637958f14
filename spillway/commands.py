"""What each `spillway` command does (spillway/cli.py parses the command line and turns errors
into exit codes). Heavy imports (temporalio's client) happen inside the commands that need
them, so `load` starts fast."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from spillway.errors import ConfigError, Failed
from spillway.settings import Settings, load_settings
from spillway.tiers import RoutingTiers, load_tiers

if TYPE_CHECKING:
    from temporalio.client import Client

    from spillway.models import Plan

OK, FAILED = 0, 1


def _config() -> tuple[Settings, RoutingTiers]:
    settings = load_settings()
    return settings, load_tiers(settings.SPILLWAY_ROUTING_TIERS)


async def _client() -> Client:
    from spillway.temporal import TemporalUnreachable, connect

    try:
        return await connect()
    except TemporalUnreachable as exc:
        raise Failed(str(exc)) from None


async def cmd_init(args: argparse.Namespace) -> int:
    from spillway.temporal import register_search_attributes

    _config()
    client = await _client()
    added = await register_search_attributes(client)
    done = f"added {', '.join(added)}" if added else "all present already"
    print(f"search attributes on namespace {client.namespace!r}: {done}")
    return OK


async def cmd_load(args: argparse.Namespace) -> int:
    from spillway.health import probe_once
    from spillway.render import render_load

    settings, _ = _config()
    load = await probe_once(settings)
    # Fail-open is the answer, not an error: a probe with failed sources still exits 0.
    print(load.model_dump_json(indent=2) if args.json else render_load(load))
    return OK


async def cmd_health(args: argparse.Namespace) -> int:
    from spillway.health import (
        budget_health,
        health_report,
        probe_once,
        temporal_health,
        workers_health,
    )
    from spillway.render import render_health

    settings, tiers = _config()
    load, temporal = await asyncio.gather(probe_once(settings), temporal_health(settings))
    health = health_report(settings, tiers, load, temporal)
    if temporal.reachable:
        health.workers, health.budget = await asyncio.gather(
            workers_health(settings), budget_health(settings)
        )
    print(health.model_dump_json(indent=2) if args.json else render_health(health))
    return OK


async def cmd_submit(args: argparse.Namespace) -> int:
    from spillway import jobs

    settings, _ = _config()
    cloud_options = {
        k: v
        for k, v in {
            "model": args.model,
            "duration": args.duration,
            "resolution": args.resolution,
        }.items()
        if v is not None
    }
    job_id = args.job_id or datetime.now(UTC).strftime("job-%Y%m%d-%H%M%S-") + os.urandom(3).hex()
    job = jobs.build_job(job_id, jobs.read_graph(args.graph), args.prompt, cloud_options)
    client = await _client()
    await jobs.submit(client, job, settings.SPILLWAY_TASK_QUEUE)
    if not args.wait:
        _print_plan_head(job.job_id, "probing", args.json)
        return OK
    plan = await _follow(client, job.job_id, quiet=args.json)
    _print_plan(plan, args.json)
    return OK if plan.state == "completed" else FAILED


async def cmd_status(args: argparse.Namespace) -> int:
    from spillway import jobs

    _config()
    plan = await jobs.status(await _client(), args.job)
    _print_plan(plan, args.json)
    return OK


async def cmd_list(args: argparse.Namespace) -> int:
    import json

    from spillway import jobs
    from spillway.render import render_jobs

    _config()
    found = await jobs.list_jobs(await _client(), args.state)
    if args.json:
        print(json.dumps([j.model_dump(mode="json") for j in found], indent=2))
    else:
        print(render_jobs(found))
    return OK


async def cmd_decide(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from spillway import jobs
    from spillway.models import ApprovalDecision
    from spillway.settings import describe_validation_error

    _config()
    try:
        decision = ApprovalDecision(
            approved=args.approved,
            by=args.by,
            reason=args.reason,
            over_budget=getattr(args, "over_budget", False),
        )
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "decision")) from None
    answer = await jobs.decide(await _client(), args.job, decision)
    print(f"job {args.job}: {answer}")
    return OK


async def cmd_budget(args: argparse.Namespace) -> int:
    from spillway.budget import ledger_summary, render_budget

    settings, _ = _config()
    summary = await ledger_summary(await _client(), settings)
    print(summary.model_dump_json(indent=2) if args.json else render_budget(summary))
    return OK


async def cmd_watch(args: argparse.Namespace) -> int:
    _config()
    plan = await _follow(await _client(), args.job, quiet=False)
    _print_plan(plan, as_json=False)
    return OK if plan.state == "completed" else FAILED


async def cmd_worker(args: argparse.Namespace) -> int:
    import worker

    return await worker.main(agents=not args.no_agents)


async def cmd_agent(args: argparse.Namespace) -> int:
    import worker

    return await worker.main(only_host=args.host)


async def cmd_dev(args: argparse.Namespace) -> int:
    import logging

    from spillway.dev import DevOptions, run_dev

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    options = DevOptions(
        simulate=args.simulate,
        port=args.port,
        ui_port=args.ui_port,
        comfyui_port=args.comfyui_port,
        guard_port=args.guard_port,
        minimax_port=args.minimax_port,
        kling_port=args.kling_port,
        state_dir=args.state_dir,
    )
    return await run_dev(options)


async def cmd_sim(args: argparse.Namespace) -> int:
    import httpx

    settings, _ = _config()
    if args.sim == "gpu":
        url = settings.comfyui("/sim/gpu")
        body: dict[str, object] = {"vram_used_pct": 42.4 if args.free else args.vram}
    else:
        url = args.guard_url.rstrip("/") + "/sim/guard"
        body = {"busy": not args.free, "job": args.job}
    try:
        async with httpx.AsyncClient() as http:
            response = await http.post(url, json=body, timeout=5)
            response.raise_for_status()
    except httpx.HTTPError:
        raise Failed(
            f"no simulator answers at {url}: is `spillway dev --simulate` running?"
        ) from None
    print(f"{args.sim} simulator now: {response.json()}")
    return OK


async def _follow(client: Client, job_id: str, quiet: bool) -> Plan:
    """Polls the job until it ends, printing each change of state or progress on stderr."""
    from spillway import jobs
    from spillway.models import FINAL_STATES

    last = ""
    while True:
        plan = await jobs.status(client, job_id)
        progress = plan.progress
        line = f"{plan.state}" + (f" {plan.route}" if plan.route else "")
        if progress is not None:
            line += f" — {progress.phase}"
            if progress.percent is not None:
                line += f" {progress.percent:.0f}%"
        if line != last and not quiet:
            print(f"{datetime.now(UTC):%H:%M:%S} {job_id}: {line}", file=sys.stderr, flush=True)
            last = line
        if plan.state in FINAL_STATES:
            return plan
        await asyncio.sleep(1)


def _print_plan_head(job_id: str, state: str, as_json: bool) -> None:
    import json

    if as_json:
        print(json.dumps({"job_id": job_id, "state": state}))
    else:
        print(f"submitted job {job_id} ({state}); follow it with: spillway watch {job_id}")


def _print_plan(plan: Plan, as_json: bool) -> None:
    from spillway.render import render_plan

    print(plan.model_dump_json(indent=2) if as_json else render_plan(plan))
