"""A loopback HTTP server with switchable failure modes, the base of every simulator.

Faults are set per path (or "*" for all paths) while the server runs, so a test can make one
endpoint hang, answer 500, answer garbage or drop the connection, and then heal it; `answers`
replaces a path's JSON (a missing or mistyped field). `stop()` keeps
the port: until `start()` again, connections are refused, which is what a restarting server does.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Literal, Self

from aiohttp import web

Fault = Literal["hang", "http500", "garbage", "html", "drop"]
TRUNCATED_JSON = '{"devices": [{"vram_total": 4'
HTML_PAGE = "<html><body><h1>502 Bad Gateway</h1></body></html>"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class SimServer:
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host, self.port = host, port
        self.faults: dict[str, Fault] = {}
        self.answers: dict[str, Any] = {}  # path -> JSON sent instead of the normal answer
        self.hits: Counter[str] = Counter()  # "GET /queue" -> requests received, faults included
        self._runner: web.AppRunner | None = None
        self._release = asyncio.Event()

    def add_routes(self, app: web.Application) -> None:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._runner is not None

    async def start(self) -> Self:
        self._release = asyncio.Event()
        app = web.Application(middlewares=[self._apply_fault])
        self.add_routes(app)
        # A server that stops drops what it was doing, as a killed ComfyUI does: aiohttp's
        # graceful stop waited up to a minute for a handler still answering (a socket's).
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        await site.start()
        if self.port == 0:
            server = site._server
            assert isinstance(server, asyncio.Server)
            self.port = server.sockets[0].getsockname()[1]
        self._runner = runner
        return self

    async def stop(self) -> None:
        self._release.set()  # lets hanging handlers end, so shutdown is immediate
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @web.middleware
    async def _apply_fault(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        self.hits[f"{request.method} {request.path}"] += 1
        fault = self.faults.get(request.path, self.faults.get("*"))
        if fault == "hang":
            await self._release.wait()
            raise web.HTTPServiceUnavailable()
        if fault == "http500":
            # aiohttp's own answer to an unhandled exception, as ComfyUI sends it.
            return web.Response(
                status=500, text="500 Internal Server Error\n\nServer got itself in trouble"
            )
        if fault == "garbage":
            return web.Response(
                text='{"devices": [{"vram_total": 4', content_type="application/json"
            )
        if fault == "html":
            return web.Response(
                text="<html><body>502 Bad Gateway</body></html>", content_type="text/html"
            )
        if fault == "drop":
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        if request.path in self.answers:
            return web.json_response(self.answers[request.path])
        return await handler(request)


async def json_body(request: web.Request) -> Any:
    """The request's JSON, or None when it is not JSON (the doubles answer that themselves)."""
    try:
        return await request.json()
    except ValueError:
        return None
