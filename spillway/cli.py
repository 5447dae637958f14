"""The `spillway` command (DESIGN.md, "The command-line contract").

Exit codes: 0 success, 1 refused or failed, 2 bad input, usage or configuration; errors are one
line on stderr, never a traceback (SPILLWAY_DEBUG=1 shows it). Every run leaves through
`os._exit`: the SDK's native bridge can crash a client process during interpreter shutdown
(temporalio/sdk-python#300), which would turn a success into a crash exit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from spillway.settings import ConfigError, Settings, load_settings
from spillway.tiers import RoutingTiers, load_tiers

if TYPE_CHECKING:
    from temporalio.client import Client

OK, FAILED, USAGE = 0, 1, 2


class Failed(Exception):
    """The operation was refused or failed (exit 1); the message says why."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(USAGE, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _config() -> tuple[Settings, RoutingTiers]:
    settings = load_settings()
    return settings, load_tiers(settings.SPILLWAY_ROUTING_TIERS)


async def cmd_init(args: argparse.Namespace) -> int:
    from spillway.temporal import register_search_attributes

    _config()
    client = await _client()
    added = await register_search_attributes(client)
    done = f"added {', '.join(added)}" if added else "all present already"
    print(f"search attributes on namespace {client.namespace!r}: {done}")
    return OK


async def cmd_load(args: argparse.Namespace) -> int:
    from spillway.health import probe_once, render_load

    settings, _ = _config()
    load = await probe_once(settings)
    # Fail-open is the answer, not an error: a probe with failed sources still exits 0.
    print(load.model_dump_json(indent=2) if args.json else render_load(load))
    return OK


async def cmd_health(args: argparse.Namespace) -> int:
    from spillway.health import health_report, probe_once, render_health

    settings, tiers = _config()
    health = health_report(settings, tiers, await probe_once(settings))
    print(health.model_dump_json(indent=2) if args.json else render_health(health))
    return OK


async def _client() -> Client:
    from spillway.temporal import TemporalUnreachable, connect

    try:
        return await connect()
    except TemporalUnreachable as exc:
        raise Failed(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="spillway",
        description=(
            "Durable router for ComfyUI video jobs: the local A40 first, paid cloud video only "
            "when the GPU is overloaded or unreachable AND the owner armed the fallback or "
            "approved the job. Temporal connection: TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, "
            "TEMPORAL_API_KEY, ... (temporalio.envconfig); default localhost:7233."
        ),
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    init = commands.add_parser(
        "init",
        help="register spillway's search attributes on the Temporal namespace (idempotent)",
        description="Register the custom search attributes (SpillwayState, SpillwayRoute, "
        "SpillwayTrigger, SpillwayOverloaded) on the connected namespace. Safe to run again.",
    )
    init.set_defaults(run=cmd_init)

    load = commands.add_parser(
        "load",
        help="measure the A40's load now (VRAM, GPU util + queue, guard)",
        description="Query the three load sources concurrently, each within "
        "LOAD_PROBE_TIMEOUT_S, and print the verdict. A failed source is listed under errors "
        "and counts as not overloaded (fail-open); the exit code is 0 either way.",
    )
    load.add_argument("--json", action="store_true", help="print the LoadStatus as JSON")
    load.set_defaults(run=cmd_load)

    health = commands.add_parser(
        "health",
        help="show the whole trigger logic, the cloud fallback's state and the live load",
        description="Every load source with its endpoint and threshold, whether the cloud "
        "fallback is armed (key present: yes/no, never the key), the approval timeout, the "
        "decision table and the live load status.",
    )
    health.add_argument("--json", action="store_true", help="print the report as JSON")
    health.set_defaults(run=cmd_health)
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else USAGE
    try:
        code: int = asyncio.run(args.run(args))
        return code
    except ConfigError as exc:
        return _fail(USAGE, str(exc))
    except Failed as exc:
        return _fail(FAILED, str(exc))
    except KeyboardInterrupt:
        return _fail(130, "interrupted")
    except Exception as exc:
        if os.environ.get("SPILLWAY_DEBUG"):
            traceback.print_exc()
        return _fail(FAILED, f"unexpected error: {type(exc).__name__}: {exc}")


def _fail(code: int, message: str) -> int:
    print(f"spillway: {message}", file=sys.stderr)
    return code


def main() -> NoReturn:
    code = run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
