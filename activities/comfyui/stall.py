"""The stall rule of a local render (docs/design.md, "A render that stalls"): when the prompt a
wait follows last moved, and how long until it has stalled (RENDER_STALL_S)."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from activities.comfyui.models import ComfyUIFinished
from activities.comfyui.watch import Silent
from spillway.core.models import Progress

RUNNING = Progress(phase="running")  # what the poll says of a running prompt: no movement


class Movement:
    """Whether a running prompt moves: a new node or sampler step. A prompt still queued, or a
    host that does not answer (the silence rules decide then), never stalls."""

    def __init__(self) -> None:
        self.at: float | None = None  # time.time() of the last move, while it runs
        self.last: Progress | None = None

    def saw(self, news: object) -> None:
        if isinstance(news, Silent) or (isinstance(news, Progress) and news.phase == "queued"):
            self.at = self.last = None
        elif isinstance(news, Progress) and news.phase == "running":
            if self.at is None or news not in (RUNNING, self.last):
                self.at = time.time()
            self.last = news if news != RUNNING else self.last

    def left(self, stall_s: float) -> float | None:
        """Seconds until the prompt has stalled; None: no limit now."""
        if not stall_s or self.at is None:
            return None
        return max(0.0, self.at + stall_s - time.time())

    def stalled(self, prompt_id: str) -> ComfyUIFinished:
        assert self.at is not None
        node = self.last.node if self.last is not None else None
        since = datetime.fromtimestamp(self.at, UTC)
        return ComfyUIFinished(prompt_id=prompt_id, outcome="stalled", still_since=since, node=node)
