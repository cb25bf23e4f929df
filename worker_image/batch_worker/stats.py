"""Stage timing, CPU seconds and NVML GPU sampling for the marker and the cost report."""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from batch_contract.marker import OPTIONAL_STAGES, STAGES


class StageClock:
    """Wall-clock seconds per stage (names from ``batch_contract.marker.STAGES``, plus those of
    ``OPTIONAL_STAGES``, which appear only once timed); thread-safe."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        self._lock = threading.Lock()
        self._open: dict[int, tuple[str, float]] = {}

    def add(self, stage: str, seconds: float) -> None:
        """Add ``seconds`` to ``stage``. Raises ``KeyError`` for a stage not in ``STAGES`` or
        ``OPTIONAL_STAGES``."""
        if stage not in self.seconds and stage not in OPTIONAL_STAGES:
            raise KeyError(f"unknown stage {stage!r}; stages are {STAGES + OPTIONAL_STAGES}")
        with self._lock:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the ``with`` body into stage ``name``."""
        t0 = time.perf_counter()
        token = object()
        with self._lock:
            self._open[id(token)] = (name, t0)
        try:
            yield
        finally:
            with self._lock:
                self._open.pop(id(token), None)
            self.add(name, time.perf_counter() - t0)

    def rounded(self, include_open: bool = False) -> dict[str, float]:
        """Seconds per stage, rounded to ms; ``include_open``: plus the time so far of stages still
        running (a progress tick's snapshot, so a killed attempt's record holds its time in flight)."""
        with self._lock:
            seconds = dict(self.seconds)
            if include_open:
                now = time.perf_counter()
                for name, t0 in self._open.values():
                    seconds[name] = seconds.get(name, 0.0) + (now - t0)
        return {k: round(v, 3) for k, v in seconds.items()}


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (all threads)."""
    t = os.times()
    return t.user + t.system


M_ARENA_MAX = -8
"""glibc ``mallopt`` parameter number of ``M_ARENA_MAX`` (``malloc.h``)."""
DEFAULT_ARENA_MAX = 2


class _MallInfo2(ctypes.Structure):
    """glibc ``struct mallinfo2`` (``malloc.h``, glibc >= 2.33): sizes in bytes."""

    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _load_libc() -> ctypes.CDLL | None:
    """glibc, loaded once (the heap helpers run after every batch); ``None`` where it is absent."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    if hasattr(libc, "mallinfo2"):
        libc.mallinfo2.restype = _MallInfo2
    return libc


_LIBC = _load_libc()


def limit_malloc_arenas() -> None:
    """Cap glibc malloc arenas (default 2; ``MALLOC_ARENA_MAX`` overrides) before threads start.

    glibc gives each thread that allocates its own arena (up to 8 x cores); with torch's intra-op
    threads and the producer thread, freed batch tensors of ever-changing shapes fragment across arenas
    and RSS grows with time. Measured here on a 64,000-row MiniLM shard: 643 -> 1,369 MB over 135 s
    with the default, 613 -> 784 MB over 90 s with 2 arenas. Must run before the threads exist;
    a no-op where glibc is absent.
    """
    try:
        arenas = int(os.environ.get("MALLOC_ARENA_MAX") or DEFAULT_ARENA_MAX)
        if _LIBC is not None:
            _LIBC.mallopt(M_ARENA_MAX, arenas)
    except (AttributeError, ValueError):
        pass


def release_memory() -> None:
    """Return freed heap pages to the OS (glibc ``malloc_trim``), so RSS tracks live memory between
    chunks; a no-op where glibc is absent."""
    if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
        _LIBC.malloc_trim(0)


def heap_free_bytes() -> int | None:
    """Bytes of freed memory glibc keeps in its heaps (``mallinfo2().fordblks``, all arenas); ``None``
    without glibc >= 2.33."""
    if _LIBC is None or not hasattr(_LIBC, "mallinfo2"):
        return None
    return int(_LIBC.mallinfo2().fordblks)


def trim_heap_above(limit_bytes: int) -> bool:
    """:func:`release_memory` when more than ``limit_bytes`` of the heap is free; returns whether it
    trimmed. A no-op (``False``) where glibc's ``mallinfo2`` is absent."""
    free = heap_free_bytes()
    if free is None or free <= limit_bytes:
        return False
    release_memory()
    return True


class GpuSampler:
    """Samples NVML GPU utilisation (percent) and memory used (bytes) once per ``interval`` seconds, of
    the device this process actually uses.

    Does nothing (``summary() == {}``) without ``nvidia-ml-py`` or without a GPU. Start it after the
    model is loaded, so loading does not count as idle device time.

    Args:
        interval: seconds between samples.
    """

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.util: list[float] = []
        self.mem_max = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = None
        self._handle = None

    def start(self, device_uuid: str | None = None) -> GpuSampler:
        """Start sampling the device named by ``device_uuid`` (NVML ``GPU-...``, e.g. the encoder's
        ``engine.device_uuid``), else the first device of ``CUDA_VISIBLE_DEVICES`` (an index or a
        UUID), else device 0. NVML numbers devices physically and ignores ``CUDA_VISIBLE_DEVICES``, so
        without this a process on GPU 3 of a node would sample GPU 0."""
        try:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            self._handle = _nvml_handle(pynvml, device_uuid)
            self._nvml = pynvml
        except Exception:  # no library, no driver, no GPU: no samples
            return self
        self._thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.util.append(float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
                self.mem_max = max(self.mem_max, int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used))
            except Exception:  # a transient NVML error loses one sample, never the run
                continue

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval)

    def summary(self) -> dict[str, float | int]:
        """``{"util_mean": percent, "samples": n, "mem_max_bytes": bytes}`` or ``{}`` without samples."""
        if not self.util:
            return {}
        return {
            "util_mean": round(sum(self.util) / len(self.util), 1),
            "samples": len(self.util),
            "mem_max_bytes": self.mem_max,
        }


def _nvml_handle(pynvml: Any, device_uuid: str | None) -> Any:
    """NVML handle of ``device_uuid``, else of the first ``CUDA_VISIBLE_DEVICES`` entry, else device 0."""
    if device_uuid:
        return pynvml.nvmlDeviceGetHandleByUUID(device_uuid)
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if first.startswith(("GPU-", "MIG-")):
        return pynvml.nvmlDeviceGetHandleByUUID(first)
    return pynvml.nvmlDeviceGetHandleByIndex(int(first) if first.isdigit() else 0)


THREADS_ENV = "BATCH_WORKER_THREADS"
"""Threads this worker may use (set per worker by the local runner: cores // parallelism)."""


def apply_thread_cap(environ: dict[str, str] | None = None) -> int:
    """Apply ``BATCH_WORKER_THREADS`` to torch (``torch.set_num_threads``) when torch is loaded, and
    return the intra-op threads in use: torch's count when loaded, else the cap, else 0 (unknown).

    Call after the engine is loaded (it imports torch); never imports torch itself.
    """
    env = os.environ if environ is None else environ
    raw = env.get(THREADS_ENV, "").strip()
    cap = int(raw) if raw.isdigit() and int(raw) > 0 else 0
    torch = sys.modules.get("torch")
    if torch is None:
        return cap
    if cap:
        torch.set_num_threads(cap)
    return int(torch.get_num_threads())
