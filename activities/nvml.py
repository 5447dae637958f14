"""GPU utilisation and memory through NVML (the `pynvml` module of `nvidia-ml-py`).

NVML calls block, so the load probe runs `read` in a thread under its timeout. On a host without
the NVIDIA driver every read raises GpuReadError with one short line; nothing here logs a stack.
"""

from __future__ import annotations

import threading
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
