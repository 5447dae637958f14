"""GPU utilisation and memory through NVML (the `pynvml` module of `nvidia-ml-py`).

NVML calls block, and a wedged driver can block them for good, so the load probe reads through
`read_apart`: one thread of NVML's own per reader, never one of the shared pool that downloads
and file work need (docs/design.md, "The load probe"). On a host without the NVIDIA driver every
read raises GpuReadError with one short line; nothing here logs a stack.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
import weakref
from typing import Any, Protocol

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
            memory = _memory(handle)
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


def _memory(handle: object) -> Any:
    """Memory as `nvidia-smi` shows it. The original call counts the driver's reserved memory as
    used (615 MiB more than nvidia-smi on an idle H200, driver 580); its v2 reports that apart.
    Drivers before v2 (older than R510) get the original."""
    try:
        return pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2)
    except (pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NotSupported):
        return pynvml.nvmlDeviceGetMemoryInfo(handle)


_Answer = asyncio.Future[GpuReading]


class _ReadThread:
    """One daemon thread per reader (a hung one never holds up the process's exit), started on
    the first read and kept while reads keep coming: starting a thread per read held the event
    loop up while it started. One read at a time: probes that ask for the same GPU while a read
    is on its way share it (fifty jobs probing at once read NVML once); a read asked for while
    one has been running for `SHARE_S` or more (NVML answers in milliseconds: that one hangs), or
    one of another GPU is running, is not queued behind it: it fails at once, "still busy"."""

    IDLE_S = 60.0  # an idle thread ends; the next read starts another
    SHARE_S = 0.2

    def __init__(self, gpu: GpuReader) -> None:
        self._gpu = gpu
        self._busy = threading.Lock()
        self._state = threading.Lock()  # guards _thread against its own idle exit
        self._thread: threading.Thread | None = None
        self._work: queue.SimpleQueue[tuple[int, _Answer]] = queue.SimpleQueue()
        self._latest: tuple[int, float, _Answer] | None = None  # (GPU, when asked, answer)

    async def read(self, index: int) -> GpuReading:
        loop = asyncio.get_running_loop()
        latest = self._latest
        if latest is not None and not latest[2].done() and latest[2].get_loop() is loop:
            gpu, asked, answer = latest
            if gpu == index and time.monotonic() - asked < self.SHARE_S:
                return await asyncio.shield(answer)
        if not self._busy.acquire(blocking=False):
            raise GpuReadError("still busy: an earlier read has not returned (NVML hung?)")
        answer = loop.create_future()
        answer.add_done_callback(_retrieved)
        with self._state:
            try:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._serve, name="nvml", daemon=True)
                    self._thread.start()
            except RuntimeError as exc:  # no thread to be had
                self._thread = None
                self._busy.release()
                raise GpuReadError(f"no thread for NVML ({exc})") from None
            self._work.put((index, answer))
        self._latest = (index, time.monotonic(), answer)
        # Shielded: a caller that gives up (its probe's timeout) leaves the answer to the others.
        return await asyncio.shield(answer)

    def _serve(self) -> None:
        while True:
            try:
                index, answer = self._work.get(timeout=self.IDLE_S)
            except queue.Empty:
                with self._state:
                    if self._work.empty():
                        self._thread = None
                        return
                continue
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
                answer.get_loop().call_soon_threadsafe(_settle, answer, outcome)


def _retrieved(answer: _Answer) -> None:
    # Every caller may have given up on a read that ends later: no "never retrieved" warning.
    if not answer.cancelled():
        answer.exception()


def _settle(answer: _Answer, outcome: GpuReading | GpuReadError) -> None:
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
