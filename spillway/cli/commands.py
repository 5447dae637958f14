"""What each `spillway` command does. Heavy imports (temporalio's client) happen
inside the commands that need them, so `load` starts fast."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import getpass
import math
import re
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from spillway.core.errors import ConfigError, Failed
from spillway.core.settings import Settings, load_settings, shown
from spillway.core.tiers import RoutingTiers, load_tiers

if TYPE_CHECKING:
    from collections.abc import Callable

    from spillway.client import SpillwayClient
    from spillway.core.ledger import LedgerSummary, Period
    from spillway.core.models import Plan

OK, FAILED = 0, 1


def _config() -> tuple[Settings, RoutingTiers]:
    settings = load_settings()
    return settings, load_tiers(settings.SPILLWAY_ROUTING_TIERS)


async def _jobs_client(settings: Settings | None = None) -> SpillwayClient:
    """Every job command goes through spillway.client, the API people use from Python."""
    from spillway.client import SpillwayClient

    return await SpillwayClient.connect(settings=settings or _config()[0])


async def cmd_init(args: argparse.Namespace) -> int:
    from spillway.core.settings import make_secret_file, secrets_dir
    from spillway.temporal import register_search_attributes

    settings = load_settings()
    folder = secrets_dir()
    if settings.SPILLWAY_LEDGER_SECRET is not None:
        print("SPILLWAY_LEDGER_SECRET: set")
    elif folder is not None:
        make_secret_file(folder, "SPILLWAY_LEDGER_SECRET")
        print(f"SPILLWAY_LEDGER_SECRET: made in {folder}, where the workers read it")
        settings = load_settings()
    else:
        print(
            "SPILLWAY_LEDGER_SECRET: not set; a worker holding cloud keys does not start without "
            "it: make one with `openssl rand -hex 32`, or set SPILLWAY_SECRETS_DIR and run "
            "`spillway init` again"
        )
    client = (await _jobs_client(settings)).temporal
    added = await register_search_attributes(client)
    done = f"added {', '.join(added)}" if added else "all present already"
    print(f"search attributes on namespace {client.namespace!r}: {done}")
    return OK


async def cmd_load(args: argparse.Namespace) -> int:
    from spillway.cli.health import probe_once
    from spillway.cli.render import render_load

    settings, _ = _config()
    load = await probe_once(settings)
    # Fail-open is the answer, not an error: a probe with failed sources still exits 0.
    print(load.model_dump_json(indent=2) if args.json else render_load(load))
    return OK


async def cmd_health(args: argparse.Namespace) -> int:
    from spillway.cli.health import (
        approval_health,
        budget_health,
        budget_settings_health,
        health_report,
        ledger_seal_health,
        probe_once,
        temporal_health,
        workers_health,
    )
    from spillway.cli.render import render_health

    settings, tiers = _config()
    load, temporal = await asyncio.gather(probe_once(settings), temporal_health(settings))
    health = health_report(settings, tiers, load, temporal)
    if temporal.reachable:
        health.workers, health.budget = await asyncio.gather(
            workers_health(settings), budget_health(settings)
        )
        health.approval = approval_health(settings, health.workers)
        ledger_seal_health(health.budget, health.workers)
        budget_settings_health(health.budget, health.workers)
    print(health.model_dump_json(indent=2) if args.json else render_health(health))
    return OK


async def cmd_submit(args: argparse.Namespace) -> int:
    from spillway.client.new_jobs import make_job, with_team

    settings, _ = _config()
    # Everything is checked before Temporal is even asked (bad input: exit 2 whatever its state).
    job = make_job(
        args.graph,
        job_id=args.job_id,
        prompt=args.prompt,
        model=args.model,
        duration=args.duration,
        resolution=args.resolution,
        callback_url=args.callback_url,
        priority=args.priority,
        max_wait=args.max_wait,
        deadline=args.deadline,
        team=args.team,
    )
    job = with_team(job, settings)
    client = await _jobs_client(settings)
    await _within_waiting_limit(client, settings, getattr(args, "team", None) or job.team)
    plan = await client.start(
        job,
        inputs=args.input,
        wait=args.wait,
        on_progress=None if args.json else _progress_printer(),
    )
    if not args.wait:
        _print_plan_head(plan.job_id, plan.state, args.json)
        return OK
    _print_plan(plan, args.json)
    return OK if plan.state == "completed" else FAILED


async def _within_waiting_limit(
    client: SpillwayClient, settings: Settings, team: str | None
) -> None:
    """Failed (exit 1, nothing started): the team has its `max_waiting` jobs in the GPU line
    already. A submit racing others, or one the pool did not answer, passes: the pool refuses
    it, and the job fails with the same words before it reaches a host or the cloud."""
    from spillway.client.queue import team_waiting
    from spillway.core.teams import load_teams, over_waiting

    teams = load_teams(settings.SPILLWAY_TEAMS_FILE)
    name = teams.team_of(team)
    limit = teams.teams[name].max_waiting
    if limit is None:
        return
    waiting = await team_waiting(client.temporal, client.task_queue, name)
    if waiting is not None and waiting >= limit:
        raise Failed(over_waiting(name, limit))


async def cmd_quote(args: argparse.Namespace) -> int:
    from spillway.cli.render import render_quote
    from spillway.client.new_jobs import make_job, with_team

    settings, _ = _config()
    job = make_job(
        args.graph,
        prompt=args.prompt,
        model=args.model,
        duration=args.duration,
        resolution=args.resolution,
        priority=args.priority,
        max_wait=args.max_wait,
        deadline=args.deadline,
        team=args.team,
    )
    job = with_team(job, settings)  # before Temporal is asked, as for submit
    quote = await (await _jobs_client(settings)).quote(job)
    print(quote.model_dump_json(indent=2) if args.json else render_quote(quote))
    return OK


async def cmd_status(args: argparse.Namespace) -> int:
    plan = await (await _jobs_client()).status(args.job)
    _print_plan(plan, args.json)
    return OK


async def cmd_list(args: argparse.Namespace) -> int:
    import json

    from spillway.cli.render import render_jobs

    settings = _config()[0]
    if args.team is not None:  # an unknown team is bad input, whatever Temporal's state
        from spillway.client.new_jobs import known_team

        known_team(args.team, settings)
    found = await (await _jobs_client(settings)).list(args.state, args.team)
    if args.json:
        print(json.dumps([j.model_dump(mode="json") for j in found], indent=2))
    else:
        print(render_jobs(found))
    return OK


async def cmd_decide(args: argparse.Namespace) -> int:
    from spillway.client.new_jobs import make_decision

    settings, _ = _config()
    decision = make_decision(args.approved, args.by, args.reason, args.over_budget)
    answer = await (await _jobs_client(settings)).decide(args.job, decision)
    print(f"job {args.job}: {answer}")
    return OK


async def cmd_priority(args: argparse.Namespace) -> int:
    spot = await (await _jobs_client()).set_priority(
        args.job,
        args.priority,
        args.by,
        args.reason,
        on_note=lambda note: print(note, file=sys.stderr),
    )
    where = (
        f"{spot.position} in line ({spot.ahead} ahead)"
        if spot is not None
        else "no longer waiting in line (it got a place)"
    )
    print(f"job {args.job}: priority {args.priority}, {where}")
    return OK


CANCEL_QUIET_S = 5.0  # a cancel that takes longer says what it waits for, on stderr


async def cmd_cancel(args: argparse.Namespace) -> int:
    client = await _jobs_client()
    show = _progress_printer()
    seen: list[Plan] = []

    def keep(plan: Plan) -> None:
        seen[:] = [plan]

    async def say_while_waiting() -> None:
        await asyncio.sleep(CANCEL_QUIET_S)
        print(
            f"{datetime.now(UTC):%H:%M:%S} {args.job}: cancel asked; waiting for the job to let "
            "go of what it holds (a render stops at its next node boundary)",
            file=sys.stderr,
            flush=True,
        )
        while True:
            if seen:
                show(seen[0])
            await asyncio.sleep(1.0)

    saying = asyncio.create_task(say_while_waiting())
    try:
        plan = await client.cancel(args.job, args.by, args.reason, on_progress=keep)
    finally:
        saying.cancel()
    _print_plan(plan, args.json)
    return OK


async def cmd_ledger(args: argparse.Namespace) -> int:
    from spillway.client.ledger_restore import restore

    settings, _ = _config()
    jobs = await _jobs_client(settings)
    secret = settings.SPILLWAY_LEDGER_SECRET
    done = await restore(
        jobs.temporal, jobs.task_queue, empty=args.empty, seal_with=secret, from_run=args.from_run
    )
    if secret is None:
        print(
            "spillway: the restored ledger is not sealed (no SPILLWAY_LEDGER_SECRET here): "
            "workers that have one refuse everything it would grant",
            file=sys.stderr,
        )
    if args.json:
        print(done.model_dump_json(indent=2))
    elif done.from_run is None:
        print(f"started an empty spend ledger {done.ledger_id}")
    else:
        print(
            f"restored spend ledger {done.ledger_id} from run {done.from_run} ({done.closed_as}): "
            f"{done.entries} entries, {done.open_entries} open, ${done.spent_usd:.2f} spent "
            "this month"
        )
    return OK


MONTH = re.compile(r"^\d{4}-\d{2}$")


def _usd(flag: str, value: str) -> float | None:
    """A budget given on the command line: USD, or `none` for no cap."""
    if value.strip().lower() == "none":
        return None
    try:
        usd = float(value)
    except ValueError:
        usd = -1.0
    if not math.isfinite(usd) or usd < 0:
        raise ConfigError(f"{flag}: {value!r} is not an amount in USD (or `none`: no cap)")
    return usd


def _team(settings: Settings, name: str) -> str:
    """A team named on the command line: one of the teams file's where this shell has it."""
    from spillway.core.teams import load_teams

    if settings.SPILLWAY_TEAMS_FILE is not None:
        return load_teams(settings.SPILLWAY_TEAMS_FILE).team_of(name)
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$", name):
        raise ConfigError(f"--team: {name!r} is not a team's name")
    return name


async def cmd_budget(args: argparse.Namespace) -> int:
    from spillway.cli.render import render_budget, render_month

    team = None if args.team is None else _team(_config()[0], args.team)
    listing = args.month is not None and MONTH.match(args.month)
    if listing and team is not None:
        raise ConfigError("--month YYYY-MM lists the studio's month: leave out --team")
    changes: dict[Period, float | None] = {}
    if args.day is not None:
        changes["day"] = _usd("--day", args.day)
    if args.month is not None and not listing:
        changes["month"] = _usd("--month", args.month)
    if listing and args.day is not None:
        raise ConfigError("--month YYYY-MM lists a month: set --day on its own")
    if changes:
        from spillway.client.budget import UNSIGNED, order_budget

        settings = _config()[0]
        if settings.SPILLWAY_LEDGER_SECRET is None:
            raise ConfigError(UNSIGNED)
        jobs = await _jobs_client(settings)
        settings = jobs.settings.model_copy(update={"SPILLWAY_TASK_QUEUE": jobs.task_queue})
        by = args.by or getpass.getuser()
        summary = await order_budget(jobs.temporal, settings, changes, by, team)
        if team is not None:
            return _print_team_spend(summary, team, args.json)
        print(summary.model_dump_json(indent=2) if args.json else render_budget(summary))
        return OK
    if args.month is not None:
        try:
            datetime.strptime(args.month, "%Y-%m")
        except ValueError:
            raise ConfigError(f"--month: {args.month!r} is not a month (YYYY-MM)") from None
        from spillway.client.budget import month_spend

        jobs = await _jobs_client()
        settings = jobs.settings.model_copy(update={"SPILLWAY_TASK_QUEUE": jobs.task_queue})
        month = await month_spend(jobs.temporal, settings, args.month)
        print(month.model_dump_json(indent=2) if args.json else render_month(month))
        return OK

    summary = await (await _jobs_client()).budget()
    if team is not None:
        return _print_team_spend(summary, team, args.json)
    print(summary.model_dump_json(indent=2) if args.json else render_budget(summary))
    return OK


def _print_team_spend(summary: LedgerSummary, team: str, as_json: bool) -> int:
    from spillway.cli.teams import render_team_spend
    from spillway.client.budget import team_spend

    spend = team_spend(summary, team)
    print(spend.model_dump_json(indent=2) if as_json else render_team_spend(spend))
    return OK


async def cmd_team(args: argparse.Namespace) -> int:
    import json

    from spillway.cli.teams import render_teams
    from spillway.client.teams import team_list

    jobs = await _jobs_client()
    settings = jobs.settings.model_copy(update={"SPILLWAY_TASK_QUEUE": jobs.task_queue})
    rows = await team_list(jobs.temporal, settings)
    if args.json:
        print(json.dumps([r.model_dump(mode="json") for r in rows], indent=2))
    else:
        print(render_teams(rows))
    return OK


async def cmd_queue(args: argparse.Namespace) -> int:
    from spillway.cli.render import render_queue
    from spillway.client.queue import pool_view

    jobs = await _jobs_client()
    view = await pool_view(jobs.temporal, jobs.task_queue)
    print(view.model_dump_json(indent=2) if args.json else render_queue(view, wide=args.wide))
    return OK


async def cmd_console(args: argparse.Namespace) -> int:
    if getattr(args, "console_action", None) == "user":
        return _console_user(args)
    from spillway.console.serve import run_console

    return await run_console(await _jobs_client(), args.host, args.port)


def _console_user(args: argparse.Namespace) -> int:
    from spillway.console.people import People, list_json

    people = People.from_environment()
    people.needed()  # every action reads or writes the people file
    if args.user_action == "list":
        found = people.names()
        if args.json:
            print(list_json(found))
        else:
            for person in found:
                print(f"{person.name}  added {person.added:%Y-%m-%d %H:%M} UTC")
            if not found:
                print("nobody may sign in yet: spillway console user add NAME")
        return OK
    if not args.name:
        raise ConfigError(f"spillway console user {args.user_action} needs the person's NAME")
    if args.user_action == "remove":
        people.remove(args.name)
        print(f"removed {args.name}: their token signs nobody in any more")
        return OK
    token = people.add(args.name)
    print(
        f"console user {args.name} added; their token (shown this once, kept only as a hash):",
        file=sys.stderr,
    )
    print(token)
    return OK


async def cmd_host(args: argparse.Namespace) -> int:
    import json

    from pydantic import ValidationError

    from spillway.cli.render import render_hosts
    from spillway.client.hosts import set_drain
    from spillway.client.queue import pool_view
    from spillway.core.gpu_pool import PoolDrain
    from spillway.core.settings import describe_validation_error

    if args.action == "list":
        jobs = await _jobs_client()
        view = await pool_view(jobs.temporal, jobs.task_queue)
        if args.json:
            print(json.dumps({"hosts": [h.model_dump(mode="json") for h in view.hosts]}, indent=2))
        else:
            print(render_hosts(view))
        return OK
    if not args.name or not args.by:
        raise ConfigError(f"spillway host {args.action} needs the host's NAME and --by WHO")
    try:
        drain = PoolDrain(
            host=args.name, drain=args.action == "drain", by=args.by, reason=args.reason
        )
    except ValidationError as exc:
        raise ConfigError(
            f"spillway host {args.action}: {describe_validation_error(exc, args.action)}"
        ) from None
    jobs = await _jobs_client()
    host = await set_drain(jobs.temporal, jobs.task_queue, drain)
    held = f"{len(host.places)} of {host.max_jobs} places held"
    if drain.drain:
        print(f"host {host.name} drained{host.drained_text().removeprefix(', drained')}: {held}")
    else:
        print(f"host {host.name} resumed: {held}; the line takes its free places")
    return OK


async def cmd_schema(args: argparse.Namespace) -> int:
    import json

    from spillway.schema import SCHEMA_NAMES, schema_text, schemas

    names = [args.name] if args.name else list(SCHEMA_NAMES)
    if args.write is None:
        if args.name:
            print(schema_text(args.name), end="")
        else:
            print(json.dumps(schemas(), indent=2, ensure_ascii=False))
        return OK
    for name in names:
        path = args.write / f"{name}.json"
        try:
            args.write.mkdir(parents=True, exist_ok=True)
            path.write_text(schema_text(name), encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot write {path}: {exc.strerror}") from None
        print(f"wrote {path}")
    return OK


async def cmd_watch(args: argparse.Namespace) -> int:
    plan = await (await _jobs_client()).wait(args.job, _progress_printer())
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

    from spillway.cli.dev import DevOptions, run_dev

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # `spillway dev`'s options are named after DevOptions' fields (parser.py).
    options = DevOptions(**{f.name: getattr(args, f.name) for f in dataclasses.fields(DevOptions)})
    return await run_dev(options)


async def cmd_sim(args: argparse.Namespace) -> int:
    import httpx

    settings, _ = _config()
    if args.sim == "gpu":
        url = settings.comfyui("/sim/gpu")
        body: dict[str, object] = {"vram_used_pct": 42.4 if args.free else args.vram}
    else:
        # The guard `spillway load` reads from this shell is the one to flip.
        guard = args.guard_url or settings.A40_GUARD_URL or "http://127.0.0.1:8189"
        url = str(guard).rstrip("/") + "/sim/guard"
        body = {"busy": not args.free, "job": args.job}
    try:
        async with httpx.AsyncClient() as http:
            response = await http.post(url, json=body, timeout=5)
            response.raise_for_status()
    except httpx.HTTPError:
        raise Failed(
            f"no simulator answers at {shown(url)}: is `spillway dev --simulate` running?"
        ) from None
    print(f"{args.sim} simulator now: {response.json()}")
    return OK


def _progress_printer() -> Callable[[Plan], None]:
    """Prints each change of a job's state or progress on stderr (stdout keeps the result)."""
    last = ""

    def show(plan: Plan) -> None:
        nonlocal last
        line = f"{plan.state}" + (f" {plan.route}" if plan.route else "")
        if plan.progress is not None:  # as `status` shows it: the node, its step and percent
            line += f" — {plan.progress.brief()}"
        if line != last:
            print(
                f"{datetime.now(UTC):%H:%M:%S} {plan.job_id}: {line}", file=sys.stderr, flush=True
            )
            last = line

    return show


def _print_plan_head(job_id: str, state: str, as_json: bool) -> None:
    import json

    if as_json:
        print(json.dumps({"job_id": job_id, "state": state}))
    else:
        print(f"submitted job {job_id} ({state}); follow it with: spillway watch {job_id}")


def _print_plan(plan: Plan, as_json: bool) -> None:
    from spillway.cli.render import render_plan
    from spillway.core.models import plan_json

    print(plan_json(plan) if as_json else render_plan(plan))
