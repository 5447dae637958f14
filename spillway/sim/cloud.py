"""What the cloud providers' doubles (MiniMax, Kling) share: a create that is read in full and
then never answered (`fault_next_create`: "hang" until `release()` or stop, "drop" at once; the
provider made the task or not, which its caller cannot know), deterministic video bytes, and
the first serial of the ids a double hands out."""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import deque
from collections.abc import Callable
from typing import Literal, TypedDict

from aiohttp import web

from spillway.sim.server import SimServer

CreateFault = Literal["hang", "drop"]
MP4_HEAD = b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom"


class Listening(TypedDict, total=False):
    """What every cloud double takes besides its own keys and knobs, passed on to CloudSim."""

    host: str
    port: int
    video_size: int


class CloudSim(SimServer):
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        video_size: int = 256 * 1024,
        video_seed: str,
    ) -> None:
        super().__init__(host, port)
        self.video_size = video_size
        self._video_seed = video_seed
        self._create_faults: deque[tuple[CreateFault, bool]] = deque()
        self._unhang = asyncio.Event()
        # The microsecond the double started: `spillway dev` restarted keeps its jobs, and a
        # task id handed out again would name an earlier job's task (and its charge). A later
        # start's ids begin above an earlier one's unless that one made a million tasks a second.
        self.first_serial = time.time_ns() // 1000

    def fault_next_create(
        self, mode: CreateFault, *, creates_task: bool = True, times: int = 1
    ) -> None:
        """The next creates are read in full and counted, then never answered: "hang" holds the
        connection open until `release()` (or stop), "drop" closes it at once. With
        `creates_task` the provider made the task anyway: the charge exists, the caller cannot
        know (Kling's caller can reconcile by its external task id)."""
        self._create_faults.extend([(mode, creates_task)] * times)

    def release(self) -> None:
        """Ends every hanging create (its connection closes without an answer)."""
        self._unhang.set()
        self._unhang = asyncio.Event()

    async def stop(self) -> None:
        self.release()
        await super().stop()

    def video_bytes(self, video_id: int | str) -> bytes:
        """The deterministic content of a video: an MP4 signature, then a pattern of its id."""
        block = hashlib.sha256(f"{self._video_seed}-{video_id}".encode()).digest() * 128
        return (MP4_HEAD + block * (self.video_size // len(block) + 1))[: self.video_size]

    async def _leave_unanswered(
        self, request: web.Request, make_task: Callable[[], object]
    ) -> web.StreamResponse:
        """The next create fault: the task made (`make_task`) or not, then no answer (the
        connection closes, at once or once released)."""
        mode, creates_task = self._create_faults.popleft()
        if creates_task:
            make_task()
        if mode == "hang":
            await self._unhang.wait()
        if request.transport is not None:  # None: the client gave up and closed it
            request.transport.close()
        return web.Response()
