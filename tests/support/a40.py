"""The A40's load sources besides ComfyUI; loaded by conftest.

- `guard`: the A40 guard double on loopback (free until a test holds it for a job).
- `gpu`: a `FakeGpu`, NVML readings injected (no driver on these machines): a utilisation, an
  error, any exception (`crash`), or a hang that lasts until released or the test ends; it
  notes the thread each read ran on (`read_threads`).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator

import pytest

from activities.probe.nvml import GpuReadError, GpuReading
from spillway.sim.guard import GuardSim


class FakeGpu:
    def __init__(self, util_pct: float | None = 10.0, error: str | None = None) -> None:
        self.util_pct, self.error = util_pct, error
        self.crash: Exception | None = None  # raised as is: what no NVML wrapper expected
        self.hang = threading.Event()  # set = hang until released
        self.released = threading.Event()
        self.read_threads: list[str] = []  # the thread each read ran on

    def read(self, index: int) -> GpuReading:
        self.read_threads.append(threading.current_thread().name)
        if self.hang.is_set():
            self.released.wait(timeout=30)
        if self.crash is not None:
            raise self.crash
        if self.error is not None:
            raise GpuReadError(self.error)
        assert self.util_pct is not None
        return GpuReading(
            index=index,
            name="NVIDIA A40",
            util_pct=self.util_pct,
            memory_used_bytes=20 * 1024**3,
            memory_total_bytes=45 * 1024**3,
        )


@pytest.fixture
async def guard() -> AsyncIterator[GuardSim]:
    async with GuardSim() as sim:
        yield sim


@pytest.fixture
def gpu() -> Iterator[FakeGpu]:
    fake = FakeGpu()
    yield fake
    fake.released.set()
