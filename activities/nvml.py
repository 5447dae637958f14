"""GPU utilisation and memory through NVML (the `pynvml` module of `nvidia-ml-py`).

NVML calls block, and a wedged driver can block them for good, so the load probe reads through
`read_apart`: one thread of NVML's own per reader, never one of the shared pool that downloads
and file work need (docs/design.md, "The load probe"). On a host without the NVIDIA driver every
read raises GpuReadError with one short line; nothing here logs a stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from typing import Protocol

import pynvml
from pydantic import BaseModel


class GpuReading(BaseModel):
    index: int
    name: str
    util_pct: float
    memory_used_bytes: int
    memory_total_bytes: int


class GpuReadError(Exception):
    pass


class GpuReader(Protocol):
    def read(self, index: int) -> GpuReading: ...


class NvmlReader:
    """Initialises NVML on first use and keeps it; retries initialisation after a failure, so a
    driver that comes back (or is installed) later is picked up without a restart."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._initialised = False

    def read(self, index: int) -> GpuReading:
        try:
            with self._lock:
                if not self._initialised:
                    pynvml.nvmlInit()
                    self._initialised = True
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            util = pynvml.nvmlDeviceGetUtilizationRates(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
        except pynvml.NVMLError_LibraryNotFound:
            raise GpuReadError(
                "NVML library not found (no NVIDIA driver on this host): GPU util not measured"
            ) from None
        except pynvml.NVMLError as exc:
            raise GpuReadError(f"NVML error on GPU {index}: {exc}") from None
        return GpuReading(
            index=index,
            name=name.decode() if isinstance(name, bytes) else str(name),
            util_pct=float(util.gpu),
            memory_used_bytes=int(memory.used),
            memory_total_bytes=int(memory.total),
        )

    def close(self) -> None:
        with self._lock:
            if self._initialised:
                pynvml.nvmlShutdown()
                self._initialised = False


class _ReadThread:
    """At most one read of a reader at a time, on a daemon thread (a hung one never holds up the
    process's exit). A read still running when the next one is asked for is not queued behind
    it: that one fails at once, "still busy"."""

    def __init__(self, gpu: GpuReader) -> None:
        self._gpu = gpu
        self._busy = threading.Lock()

    async def read(self, index: int) -> GpuReading:
        if not self._busy.acquire(blocking=False):
            raise GpuReadError("still busy: an earlier read has not returned (NVML hung?)")
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[GpuReading] = loop.create_future()

        def run() -> None:
            outcome: GpuReading | GpuReadError
            try:
                outcome = self._gpu.read(index)
            except GpuReadError as exc:
                outcome = exc
            except Exception as exc:  # any failure reads as one line, never a stack
                text = " ".join(str(exc).split())
                outcome = GpuReadError(f"{type(exc).__name__}: {text}" if text else repr(exc))
            finally:
                self._busy.release()
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                loop.call_soon_threadsafe(_settle, answer, outcome)

        try:
            threading.Thread(target=run, name="nvml", daemon=True).start()
        except RuntimeError as exc:  # no thread to be had
            self._busy.release()
            raise GpuReadError(f"no thread for NVML ({exc})") from None
        return await answer


def _settle(answer: asyncio.Future[GpuReading], outcome: GpuReading | GpuReadError) -> None:
    if answer.done():  # the probe timed out meanwhile
        return
    if isinstance(outcome, GpuReadError):
        answer.set_exception(outcome)
    else:
        answer.set_result(outcome)


_threads: weakref.WeakKeyDictionary[GpuReader, _ReadThread] = weakref.WeakKeyDictionary()


async def read_apart(gpu: GpuReader, index: int) -> GpuReading:
    """`gpu.read(index)` on the reader's own thread. Every probe of every host sharing a reader
    shares its one thread: a hung NVML costs one thread, and each later probe fails fast with
    GpuReadError("still busy ...") until it returns. Raises GpuReadError for any failure."""
    thread = _threads.get(gpu)
    if thread is None:
        thread = _threads[gpu] = _ReadThread(gpu)
    return await thread.read(index)
