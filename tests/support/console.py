"""The studio console for tests: `console_app(client, task_queue, folder, ...)` builds the app
on a Temporal client with its people in `folder`; `asgi_client(app)` talks to it in process;
`serving_console(app)` serves it on a free port of 127.0.0.1 for a browser."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from temporalio.client import Client

from spillway.client import SpillwayClient
from spillway.console.app import Console, create_app
from spillway.console.people import People
from spillway.console.sessions import Signer
from tests.support.cli import free_ports
from tests.support.settings import make_settings
from tests.support.waiting import until


def console_app(
    client: Client,
    task_queue: str,
    folder: Path,
    *,
    open_read: bool = True,
    **settings: Any,
) -> tuple[Starlette, People]:
    people = People(folder)
    console = Console(
        client=SpillwayClient(client, settings=make_settings(settings), task_queue=task_queue),
        people=people,
        signer=Signer(b"console test key"),
        open_read=open_read,
        ui_url="http://ui.test:8233",
    )
    return create_app(console), people


@contextlib.asynccontextmanager
async def asgi_client(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as http:
        yield http


@contextlib.asynccontextmanager
async def serving_console(app: Starlette) -> AsyncIterator[str]:
    """The app on uvicorn in this event loop; yields its URL."""
    [port] = free_ports(1)
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="off"
    )
    server = uvicorn.Server(config)
    # uvicorn would take over SIGINT and SIGTERM for the whole test process.
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign, assignment]
    task = asyncio.create_task(server.serve())
    await until(lambda: server.started or task.done(), what="the console listening")
    if task.done():
        task.result()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
