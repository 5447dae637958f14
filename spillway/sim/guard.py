"""A double of the A40 guard semaphore: `GET /api/burst/a40-guard/status`.

`status` is sent as it is, so a test can also make the guard answer nonsense
(`{"busy": "yes"}`) and check that the probe fails open.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from spillway.sim.server import SimServer

GUARD_STATUS_PATH = "/api/burst/a40-guard/status"


class GuardSim(SimServer):
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(host, port)
        self.status: Any = {"busy": False, "job": None}

    def hold(self, job: str | None) -> None:
        self.status = {"busy": True, "job": job}

    def free(self) -> None:
        self.status = {"busy": False, "job": None}

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(GUARD_STATUS_PATH, self._status)
        app.router.add_post("/sim/guard", self._set)

    async def _set(self, request: web.Request) -> web.Response:
        """Not the guard's: how `spillway sim guard` holds or frees the simulated semaphore."""
        body = await request.json()
        if body.get("busy"):
            self.hold(body.get("job"))
        else:
            self.free()
        return web.json_response(self.status)

    async def _status(self, request: web.Request) -> web.Response:
        return web.json_response(self.status)
