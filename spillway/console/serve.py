"""Running the console: the app on uvicorn, bound to 127.0.0.1 unless told otherwise."""

from __future__ import annotations

import contextlib
import ipaddress
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from spillway.client import SpillwayClient
from spillway.console.app import Console, create_app
from spillway.console.people import People
from spillway.console.sessions import Signer, console_secret
from spillway.core.errors import ConfigError
from spillway.core.settings import Settings, secrets_dir


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_read(settings: Settings, host: str) -> bool:
    """Reading without signing in: as SPILLWAY_CONSOLE_OPEN_READ says; unset, only while the
    console listens on this machine alone."""
    chosen = settings.SPILLWAY_CONSOLE_OPEN_READ
    return loopback(host) if chosen is None else chosen


def make_console(client: SpillwayClient, host: str, folder: Path | None = None) -> Console:
    """`folder`: where its people and its cookie key are kept (default SPILLWAY_SECRETS_DIR)."""
    folder = folder if folder is not None else secrets_dir()
    return Console(
        client=client,
        people=People(folder),
        signer=Signer(console_secret(folder)),
        open_read=open_read(client.settings, host),
        ui_url=str(client.settings.SPILLWAY_UI_URL).rstrip("/"),
    )


@dataclass
class Served:
    server: uvicorn.Server
    url: str


def console_server(
    client: SpillwayClient,
    host: str,
    port: int,
    *,
    folder: Path | None = None,
    own_signals: bool = True,
) -> Served:
    """`own_signals` False: Ctrl-C is its host process's to handle (`spillway dev` stops the
    console with everything else)."""
    if not 0 < port < 65536:
        raise ConfigError(f"--port: {port} is not a TCP port")
    app = create_app(make_console(client, host, folder))
    # uvicorn's own access log would print every poll of every open page.
    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", access_log=False, lifespan="off"
    )
    server = uvicorn.Server(config)
    if not own_signals:
        server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign, assignment]
    shown = f"[{host}]" if ":" in host else host
    return Served(server, f"http://{shown}:{port}/")


async def run_console(
    client: SpillwayClient, host: str, port: int, say: Callable[[str], None] | None = None
) -> int:
    served = console_server(client, host, port)
    reading = "open" if open_read(client.settings, host) else "after signing in"
    (say or _stderr)(
        f"spillway console on {served.url} (reading {reading}; acting after signing in with a "
        "token from `spillway console user add NAME`); Ctrl-C stops it"
    )
    if secrets_dir() is None:
        (say or _stderr)(
            "no SPILLWAY_SECRETS_DIR: nobody can sign in, so nothing can be done from the page; "
            "set it as for the workers, then `spillway console user add NAME`"
        )
    await served.server.serve()
    return 0 if served.server.started else 1


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
