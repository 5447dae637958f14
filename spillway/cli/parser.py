"""The `spillway` command line: every command, its options and its help (docs/design.md, "The
command-line contract"). A usage error exits 2 (USAGE)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn, get_args

from spillway.cli import commands as cmd
from spillway.core.models import JobState
from spillway.schema import SCHEMA_NAMES

USAGE = 2  # the exit code of bad input, usage or configuration
STATES = list(get_args(JobState))


# argparse reads a value that starts with "-" after a space as an option of its own, and says
# only "expected one argument": `--max-wait -5m` deserves to hear what a duration is.
NO_VALUE_HINTS = {
    "--max-wait": "a duration such as 90s, 10m or 2h, never negative (a value that starts with "
    "'-' goes as --max-wait=VALUE)",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        for option, hint in NO_VALUE_HINTS.items():
            if message == f"argument {option}: expected one argument":
                message += f": {hint}"
        self.exit(USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def job_options(sub: argparse.ArgumentParser) -> None:
    """What `submit` and `quote` take alike."""
    sub.add_argument("--graph", type=Path, required=True, help="API-format ComfyUI graph JSON")
    sub.add_argument("--prompt", help="text prompt for MiniMax; without it: local only")
    sub.add_argument("--model", help="MiniMax model (default MiniMax-Hailuo-2.3)")
    sub.add_argument("--duration", type=int, help="cloud clip length in seconds (6 or 10)")
    sub.add_argument("--resolution", help="cloud resolution (512P, 720P, 768P, 1080P)")
    sub.add_argument(
        "--priority",
        type=int,
        choices=range(1, 6),
        default=3,
        metavar="1..5",
        help="1 first .. 5 last (default 3): Temporal's task priority for the job's work when "
        "a queue is backlogged, and its place in the GPU line; shown by list",
    )
    patience = sub.add_mutually_exclusive_group()
    patience.add_argument(
        "--max-wait",
        metavar="DURATION",
        help="its patience (90s, 10m, 2h): armed and every GPU place taken, it waits in line "
        "while the line's estimate is within this, and goes to the cloud once it is not "
        "(default: the workers' CLOUD_OVERFLOW_AFTER_S; 0: at once)",
    )
    patience.add_argument(
        "--deadline",
        metavar="TIME",
        help="done by then (ISO 8601 with a zone, e.g. 2026-12-05T18:00:00Z): its patience is "
        "the time left minus a typical render",
    )
    sub.add_argument(
        "--team",
        metavar="NAME",
        help="who the job is for: a team of SPILLWAY_TEAMS_FILE, read here as by the workers "
        "(default: the file's default team; without a file the one team, studio)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="spillway",
        description=(
            "Durable router for ComfyUI video jobs: the local GPU hosts first, paid cloud video "
            "only when the GPUs are overloaded or unreachable AND the owner armed the fallback or "
            "approved the job. Temporal connection: TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, "
            "TEMPORAL_API_KEY, ... (temporalio.envconfig); default localhost:7233."
        ),
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    def command(
        name: str,
        run: object,
        help: str,
        description: str,
        *,
        job: bool = False,  # takes the job's id: JOB
        json: str | None = None,  # the help of its --json
    ) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=description)
        sub.set_defaults(run=run)
        if job:
            sub.add_argument("job", metavar="JOB")
        if json is not None:
            sub.add_argument("--json", action="store_true", help=json)
        return sub

    command(
        "init",
        cmd.cmd_init,
        "register spillway's search attributes; make the spend ledger's secret (idempotent)",
        "Register the custom search attributes (SpillwayState, SpillwayRoute, SpillwayTrigger, "
        "SpillwayOverloaded, SpillwayHost, SpillwayTeam) on the connected namespace. With "
        "SPILLWAY_SECRETS_DIR set and no SPILLWAY_LEDGER_SECRET yet, first make one in that "
        "folder (the file SPILLWAY_LEDGER_SECRET, readable by its owner only), where the "
        "workers read it; a worker holding cloud keys does not start without one. Safe to run "
        "again.",
    )
    command(
        "load",
        cmd.cmd_load,
        "measure the GPU's load now, from this shell (VRAM, GPU util + queue, guard)",
        "Query the three load sources concurrently, each within LOAD_PROBE_TIMEOUT_S, and print "
        "the verdict. A failed source is listed under errors and counts as not overloaded "
        "(fail-open); the exit code is 0 either way.",
        json="print the LoadStatus as JSON",
    )
    command(
        "health",
        cmd.cmd_health,
        "show Temporal's state, the whole trigger logic, the cloud fallback and the live load",
        "The Temporal connection, the workers polling the task queue and the jobs awaiting "
        "approval; every load source with its endpoint and threshold, whether the cloud "
        "fallback is armed "
        "(key present: yes/no, never the key), the approval timeout, the decision table and the "
        "live load status.",
        json="print the report as JSON",
    )

    submit = command(
        "submit",
        cmd.cmd_submit,
        "submit a video job (an API-format ComfyUI graph, optionally a cloud prompt)",
        "Start a job: measure the GPU hosts, then render locally, in the cloud (only if armed or "
        "approved) or wait for approval. Everything is validated before anything starts.",
    )
    job_options(submit)
    submit.add_argument("--job-id", help="job id (default: job-<UTC time>-<random>)")
    submit.add_argument(
        "--input",
        action="append",
        metavar="NODE=PATH",
        help="an image for an image-to-video graph: NODE is the image loader's node id (PATH "
        "alone when the graph has one loader); stored once, uploaded to the ComfyUI that "
        "renders, the cloud's first frame; repeatable",
    )
    submit.add_argument(
        "--callback-url",
        metavar="URL",
        help="POST job.completed|failed|cancelled here instead of to the workers' "
        "JOB_WEBHOOK_URL, unsigned (only JOB_WEBHOOK_URL is signed with JOB_WEBHOOK_SECRET). "
        "A per-job URL travels in the job's "
        "input and so in its history: a URL that holds a secret belongs in JOB_WEBHOOK_URL on "
        "the workers, which keeps it out of every history",
    )
    submit.add_argument("--wait", action="store_true", help="follow the job until it ends")
    submit.add_argument("--json", action="store_true", help="print JSON")

    quote = command(
        "quote",
        cmd.cmd_quote,
        "where a job would run now, and what the cloud would cost: nothing is started",
        "The route a job with these options would take now, under the rules a job applies: the "
        "GPU hosts that can run its graph, its position in the GPU line (0: a place now) with an "
        "estimate from the hosts' recent renders, the cloud's estimate for its clip and what the "
        "budgets have left, and why. Nothing is started, queued or reserved. Read through a "
        "running worker, whose agents measure the hosts as for a job.",
        json="print the quote as JSON",
    )
    job_options(quote)

    command(
        "status",
        cmd.cmd_status,
        "show a job's plan: state, route, reasons, approval, progress, outputs",
        "Works for running and finished jobs, with or without a worker running.",
        job=True,
        json="print the plan as JSON",
    )

    listing = command(
        "list", cmd.cmd_list, "list jobs, newest first", "List jobs, optionally in one state."
    )
    listing.add_argument("--state", choices=STATES, help="only jobs in this state")
    listing.add_argument(
        "--team",
        metavar="NAME",
        help="only this team's jobs (the default team's include jobs started without a team)",
    )
    listing.add_argument("--json", action="store_true", help="print a JSON array")

    for name, approved in (("approve", True), ("reject", False)):
        decide = command(
            name,
            cmd.cmd_decide,
            f"{name} the cloud for a job that awaits approval",
            f"{name.capitalize()} sending a waiting job to the paid cloud"
            + ("." if approved else ": it runs locally instead.")
            + " With SPILLWAY_APPROVAL_SECRET in this environment the decision is signed for the "
            "job (workers that hold the secret use only signed decisions).",
            job=True,
        )
        decide.add_argument("--by", required=True, help="who decides (recorded in the job)")
        decide.add_argument("--reason", default="", help="why (recorded in the job)")
        if approved:
            decide.add_argument(
                "--over-budget",
                action="store_true",
                help="go past CLOUD_DAILY_BUDGET_USD / CLOUD_MONTHLY_BUDGET_USD for this job "
                "(recorded); without it an approval the budget cannot cover is refused",
            )
        else:
            decide.set_defaults(over_budget=False)
        decide.set_defaults(approved=approved)

    budget = command(
        "budget",
        cmd.cmd_budget,
        "show cloud spending and the budget; --day/--month USD set the budget",
        "What the spend ledger holds (UTC days and months): its budgets and who set them, what "
        "was spent (charged, and maybe_charged after an ambiguous create), what is reserved for "
        "creates under way, and every cloud create the ledger holds now. Read through a running "
        "worker. The budget is the ledger's: --day and --month set it (USD, or `none` for no "
        "cap), in an order signed with SPILLWAY_LEDGER_SECRET (the workers' secret; exit 2 "
        "without it); a worker's CLOUD_DAILY_BUDGET_USD / CLOUD_MONTHLY_BUDGET_USD only seed a "
        "ledger that never had a budget set.",
        json="print the ledger summary as JSON",
    )
    budget.add_argument(
        "--day", metavar="USD", help="set the daily budget (USD, or `none`: no daily cap)"
    )
    budget.add_argument(
        "--month",
        metavar="USD|YYYY-MM",
        help="USD (or `none`): set the monthly budget. YYYY-MM: that month instead: what was "
        "spent, and every create its ledger runs recorded (read from their histories, so as far "
        "back as the namespace's retention)",
    )
    budget.add_argument(
        "--by", help="who sets the budget (recorded in the ledger; default: this login)"
    )
    budget.add_argument(
        "--team",
        metavar="NAME",
        help="that team's own budget, beside the studio's (SPILLWAY_TEAMS_FILE): its spend and "
        "what it has left; with --day/--month USD, set it (a team's jobs need both budgets)",
    )

    team = command(
        "team",
        cmd.cmd_team,
        "list the teams: share, GPU places held, jobs waiting, budget left",
        "Each team of SPILLWAY_TEAMS_FILE (one team, `studio`, without it): its share of the GPU "
        "places, the places its jobs hold and how many wait (the GPU pool's view; a job from "
        "before teams counts as the default team's), and what its own budget has left today "
        "and this month (the spend ledger's; none: only the studio's budget applies). Read "
        "through a running worker.",
        json="print a JSON array of the teams",
    )
    team.add_argument("action", choices=["list"])

    queue = command(
        "queue",
        cmd.cmd_queue,
        "show the GPU line: each host's places (who holds them, since when) and who waits",
        "spillway hands each GPU host at most `max_jobs` of its jobs at once (routing_tiers.json, "
        "or A40_MAX_JOBS for a single host); the others wait in the GPU pool's line, by priority "
        "(1 first) then arrival, each with an estimate from the hosts' recent render times. "
        "Read through a running worker.",
        json="print the places and the line as JSON",
    )
    queue.add_argument(
        "--wide",
        action="store_true",
        help="job ids and each why whole, a row per job (default: 100 columns, why wrapped)",
    )

    console = command(
        "console",
        cmd.cmd_console,
        "serve the studio console: hosts, renders, the line, approvals, spend (a web page)",
        "A web page (and a JSON API beside it: GET /api/queue, /api/jobs/JOB, /api/teams, "
        "/healthz; POST /api/jobs/JOB/approve|reject|cancel|priority and /api/hosts/NAME/"
        "drain|resume with Authorization: Bearer TOKEN) "
        "showing the GPU hosts, the renders and their progress, the line with each job's why "
        "and estimate, the jobs awaiting approval with their quote, recent jobs linked to the "
        "Temporal UI, and the cloud spend per day and team; it updates itself every 1.5 s. It "
        "reads and acts through the same queries, updates and signals as these commands, with "
        "the signed-in person as --by. Acting needs a person: `spillway console user add NAME` "
        "prints their token once and keeps its hash in SPILLWAY_SECRETS_DIR. Reading without "
        "signing in: SPILLWAY_CONSOLE_OPEN_READ (unset: open on 127.0.0.1 only). Connects to "
        "Temporal as the other commands do; docs/console.md has the details.",
    )
    console.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine)"
    )
    console.add_argument("--port", type=int, default=8240, help="port to listen on (8240)")
    people = console.add_subparsers(dest="console_action", metavar="user", parser_class=_Parser)
    user = people.add_parser(
        "user",
        help="add, list or remove the people who may sign in",
        description="`user add NAME` prints NAME's token once (keep it: only its hash is kept, "
        "in SPILLWAY_SECRETS_DIR); `user list` names the people; `user remove NAME` signs NAME "
        "out everywhere at once. NAME is what the console records as --by when they act.",
    )
    user.add_argument("user_action", choices=["add", "list", "remove"])
    user.add_argument("name", metavar="NAME", nargs="?", help="the person (add, remove)")
    user.add_argument("--json", action="store_true", help="list: print the people as JSON")

    cancel = command(
        "cancel",
        cmd.cmd_cancel,
        "cancel a job that has not ended; who and why are recorded in it",
        "Record who cancels the job and why in its plan (`status` shows them), cancel it, and "
        "wait until it shows `cancelled`: a job lets go of what it holds first (its ComfyUI "
        "prompt, which a render gives up at its next node boundary; a cloud create already "
        "sent is awaited, and its task recorded). A job that has ended refuses it (exit 1, "
        "naming its state). Needs a running worker to take effect.",
        job=True,
        json="print the cancelled job's plan as JSON",
    )
    cancel.add_argument("--by", required=True, help="who cancels it (recorded in the job)")
    cancel.add_argument("--reason", default="", help="why (recorded in the job)")

    priority = command(
        "priority",
        cmd.cmd_priority,
        "move a job waiting in the GPU line to another priority (1 first)",
        "A job that waits in the GPU line (queued, or awaiting_approval) takes priority N: its "
        "place in the line follows at once (by priority, then when it asked, with aging). The "
        "change, who made it and why are in the job's history and `status`; the workflow's "
        "Temporal priority, which the Temporal UI shows, follows (a server that cannot change it "
        "says so in one line on stderr, exit 0). A job that is not waiting in the line "
        "(running, finished) refuses it (exit 1).",
        job=True,
    )
    priority.add_argument("priority", metavar="N", type=int, help="1 (first) .. 5 (last)")
    priority.add_argument("--by", required=True, help="who moves it (recorded in the job)")
    priority.add_argument("--reason", default="", help="why (recorded in the job)")

    host = command(
        "host",
        cmd.cmd_host,
        "drain a GPU host for maintenance, resume it, or list the hosts",
        "A drained host is given no new GPU places: the jobs holding its places finish, and the "
        "line goes to the other hosts that can run its jobs, or waits (an armed job overflows "
        "to the cloud by the usual rules: a drained host counts as full). The drain is kept by "
        "the GPU pool (through restarts) until `resume`, and shown by `host list`, `queue` and "
        "`health`. Read and sent through a running worker.",
        json="list: print the hosts as JSON",
    )
    host.add_argument("action", choices=["drain", "resume", "list"])
    host.add_argument("name", metavar="NAME", nargs="?", help="the GPU host (drain, resume)")
    host.add_argument("--by", help="who drains or resumes it (drain, resume; recorded)")
    host.add_argument("--reason", default="", help="why (drain; shown to people in line)")

    ledger = command(
        "ledger",
        cmd.cmd_ledger,
        "bring a closed spend ledger's entries back (restore)",
        "A spend ledger that was terminated or failed is never started again empty by a job: "
        "until it is restored, no cloud create is sent (jobs that need one fail saying so). "
        "`spillway ledger restore` starts it again with every entry of its last run, rebuilt "
        "from that run's history; with --i-know-it-is-empty it starts an empty one instead "
        "(what was spent before is then forgotten by the budget). With SPILLWAY_LEDGER_SECRET "
        "set (as on the workers) the new ledger is sealed, and the entries come from the newest "
        "run spillway made, passing over runs someone else started; --from-run names the run "
        "instead (the first time the secret is set, every earlier run is unsealed).",
        json="print what was restored as JSON",
    )
    ledger.add_argument("action", choices=["restore"], help="restore: start it again")
    ledger.add_argument(
        "--i-know-it-is-empty",
        dest="empty",
        action="store_true",
        help="start an empty ledger on purpose (no closed run to restore, or its entries unwanted)",
    )
    ledger.add_argument(
        "--from-run",
        metavar="RUN_ID",
        help="restore the entries of this closed run of the ledger, whoever started it",
    )

    schema = command(
        "schema",
        cmd.cmd_schema,
        "print the JSON Schemas of a job's input, an approval, a plan and the GPU line",
        "The contract for clients in any language: video-job (the input of the workflow "
        "VideoJobWorkflow: workflow id = job_id, task queue SPILLWAY_TASK_QUEUE), approval (the "
        "`approval` signal), plan (status --json, the workflow's result) and queue (queue "
        "--json). Without NAME all four as one JSON object keyed by name. Committed as "
        "docs/schema/NAME.json.",
    )
    schema.add_argument(
        "name",
        metavar="NAME",
        nargs="?",
        choices=SCHEMA_NAMES,
        help=f"one of {', '.join(SCHEMA_NAMES)} (default: all)",
    )
    schema.add_argument(
        "--write", type=Path, metavar="DIR", help="write DIR/NAME.json instead of printing"
    )

    command(
        "watch",
        cmd.cmd_watch,
        "follow a job's state and progress until it ends",
        "Print each change of state and progress until the job completes, fails or is "
        "cancelled; exit 0 only if it completed.",
        job=True,
    )

    dev = command(
        "dev",
        cmd.cmd_dev,
        "run everything locally: Temporal dev server + Web UI, the worker, and simulators",
        "Without TEMPORAL_ADDRESS, start the Temporal dev server (Web UI included) with its "
        "jobs kept in .spillway/temporal.db, register the search attributes and run the "
        "worker; with --simulate also the ComfyUI, guard, MiniMax and Kling simulators on their "
        "usual local ports (no GPU, no key, no money), its jobs kept apart in "
        ".spillway/sim/temporal.db on the task queue spillway-sim (<SPILLWAY_TASK_QUEUE>-sim). "
        "Ctrl-C stops everything it started.",
    )
    dev.add_argument("--simulate", action="store_true", help="serve the simulators too")
    dev.add_argument("--port", type=int, default=7233, help="Temporal frontend (7233)")
    dev.add_argument("--ui-port", type=int, default=8233, help="Temporal Web UI (8233)")
    dev.add_argument("--comfyui-port", type=int, default=8188, help="ComfyUI simulator (8188)")
    dev.add_argument("--guard-port", type=int, default=8189, help="guard simulator (8189)")
    dev.add_argument("--minimax-port", type=int, default=8190, help="MiniMax simulator (8190)")
    dev.add_argument("--kling-port", type=int, default=8191, help="Kling simulator (8191)")
    dev.add_argument(
        "--console-port", type=int, default=8240, help="the studio console (8240; 0: none)"
    )
    dev.add_argument(
        "--render-s",
        type=float,
        default=8.0,
        metavar="S",
        help="seconds the ComfyUI simulator renders each prompt (8): a few jobs at once show "
        "the GPU line (`spillway queue`)",
    )
    dev.add_argument(
        "--state-dir", type=Path, default=Path(".spillway"), help="where jobs are kept"
    )

    sim = command(
        "sim",
        cmd.cmd_sim,
        "change the simulators of `spillway dev --simulate` (GPU load, guard)",
        "Flip the simulated GPU between free and busy, or hold/free the simulated guard.",
    )
    sims = sim.add_subparsers(dest="sim", metavar="WHAT", parser_class=_Parser)
    sims.required = True
    gpu = sims.add_parser("gpu", help="set the simulated GPU's VRAM use (at COMFYUI_URL)")
    load_choice = gpu.add_mutually_exclusive_group(required=True)
    load_choice.add_argument("--vram", type=float, help="percent of VRAM in use, e.g. 95")
    load_choice.add_argument("--free", action="store_true", help="back to 42.4%% (free)")
    guard = sims.add_parser("guard", help="hold or free the simulated guard semaphore")
    guard_choice = guard.add_mutually_exclusive_group(required=True)
    guard_choice.add_argument("--busy", action="store_true", help="the GPU holds a job")
    guard_choice.add_argument("--free", action="store_true", help="the GPU holds none")
    guard.add_argument("--job", help="job the guard names while busy")
    guard.add_argument(
        "--guard-url",
        help="simulator URL (default: A40_GUARD_URL, as `spillway load` reads the guard; else "
        "http://127.0.0.1:8189)",
    )

    worker = command(
        "worker",
        cmd.cmd_worker,
        "run the worker (same as python worker.py), with the GPU hosts' agents",
        "Run the worker: the workflows, the policy, the spend ledger and the cloud on "
        "SPILLWAY_TASK_QUEUE (long cloud waits on SPILLWAY_TASK_QUEUE-waits), and the agent of "
        "every GPU host of routing_tiers.json in the same process.",
    )
    worker.add_argument(
        "--no-agents",
        action="store_true",
        help="leave the GPU hosts to agents that run next to their GPUs (spillway agent)",
    )
    agent = command(
        "agent",
        cmd.cmd_agent,
        "run the agent of one GPU host, next to its GPU and ComfyUI",
        "Serve one GPU host's load probe (NVML reads this machine's GPU) and its ComfyUI "
        "activities on SPILLWAY_TASK_QUEUE-gpu-HOST, and its long waits and downloads on "
        "SPILLWAY_TASK_QUEUE-gpu-HOST-waits. HOST is a local tier's name in routing_tiers.json.",
    )
    agent.add_argument("--host", required=True, help="the GPU host's name (a local tier's name)")
    return parser
