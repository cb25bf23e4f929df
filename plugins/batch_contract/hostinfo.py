"""Facts about the host a worker or a benchmark ran on (stdlib only; Linux sysfs/procfs, else less).

The same code and data ran at half the speed on another machine of the same kind (issue #22): figures
mean little without the host they came from. :func:`host_facts` gathers what explains such differences
and fits in a marker or a benchmark's JSON: the CPU model, logical cores and threads per core, the cache
sizes per level (``/sys/devices/system/cpu/cpu0/cache/index*``), bf16/AMX support (``/proc/cpuinfo``
flags), total memory (``/proc/meminfo``) and the load average (``os.getloadavg``). Every field is
optional: what a platform does not expose is left out, never guessed.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

CPU_FLAGS = ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx2")
"""``/proc/cpuinfo`` flags recorded: bf16 matmuls run natively with ``avx512_bf16`` (AVX512-BF16) or
``amx_bf16``/``amx_tile`` (AMX tiles, Intel Sapphire Rapids and later), emulated otherwise."""

SYS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
PROC_CPUINFO = Path("/proc/cpuinfo")
PROC_MEMINFO = Path("/proc/meminfo")
SYS_THREAD_SIBLINGS = Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")

COMPARED_FIELDS = ("cpu_model", "logical_cores", "threads_per_core", "caches", "bf16", "amx", "mem_total_bytes")
"""Fields that describe the machine itself (not its moment): two records differing in any of these
ran on different kinds of host (:func:`host_key`). Load average is left out: it changes by the second."""


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def parse_size(text: str) -> int | None:
    """Bytes of a sysfs cache size such as ``"48K"``, ``"2048K"``, ``"105M"`` or ``"512"``; ``None``
    when unparseable."""
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    return int(digits) * scale if digits.isdigit() else None


def _shared_cpus(text: str) -> int:
    """Number of CPUs in a sysfs CPU list such as ``"0-3,8"``."""
    count = 0
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        count += int(hi or lo) - int(lo) + 1
    return count


def cache_levels(root: Path = SYS_CACHE) -> list[dict[str, Any]]:
    """CPU 0's caches, one dict per sysfs ``index*`` entry, ordered by level then type:
    ``{"level": 1..3, "type": "Data"|"Instruction"|"Unified", "size_bytes": int, "shared_by": cpus}``.
    ``shared_by`` is how many logical CPUs share that cache (1 for a per-core L2). Empty off Linux."""
    out = []
    for index in sorted(root.glob("index*")):
        level, kind, size = (_read(index / name) for name in ("level", "type", "size"))
        if not (level and kind and size) or parse_size(size) is None:
            continue
        shared = _read(index / "shared_cpu_list")
        out.append({"level": int(level), "type": kind.strip(), "size_bytes": parse_size(size),
                    "shared_by": _shared_cpus(shared) if shared else 1})
    return sorted(out, key=lambda c: (c["level"], c["type"]))


def cache_bytes(facts: dict[str, Any], level: int) -> int | None:
    """Size in bytes of the data/unified cache of ``level`` in ``facts["caches"]`` (per instance, as
    sysfs reports it), or ``None`` when unknown."""
    for cache in facts.get("caches") or []:
        if cache["level"] == level and cache["type"] in ("Data", "Unified"):
            return int(cache["size_bytes"])
    return None


def _cpuinfo(text: str | None) -> tuple[str, set[str]]:
    """(model name, flags) of the first processor in ``/proc/cpuinfo`` text."""
    model, flags = "", set()
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
        if model and flags:
            break
    return model, flags


def _mem_total(text: str | None) -> int | None:
    for line in (text or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def load_average() -> list[float] | None:
    """The 1-, 5- and 15-minute load averages (runnable processes), rounded to 0.01; ``None`` where
    the platform has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def host_facts() -> dict[str, Any]:
    """The host this process runs on, JSON-ready.

    Keys: ``cpu_model`` (``/proc/cpuinfo`` model name, else :func:`platform.processor`), ``machine``
    (e.g. ``x86_64``), ``logical_cores`` (:func:`os.cpu_count`), ``usable_cores`` (this process's
    affinity), ``threads_per_core`` (CPU 0's thread siblings), ``caches`` (:func:`cache_levels`),
    ``cpu_flags`` (those of :data:`CPU_FLAGS` present), ``bf16`` (native bf16 matmuls: AVX512-BF16 or
    AMX), ``amx``, ``mem_total_bytes`` and ``load_avg`` (:func:`load_average`). Reads a few small
    files (about a millisecond); never raises.
    """
    model, flags = _cpuinfo(_read(PROC_CPUINFO))
    siblings = _read(SYS_THREAD_SIBLINGS)
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    present = [f for f in CPU_FLAGS if f in flags]
    return {
        "cpu_model": model or platform.processor() or platform.machine(),
        "machine": platform.machine(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "threads_per_core": _shared_cpus(siblings) if siblings else None,
        "caches": cache_levels(),
        "cpu_flags": present,
        "bf16": bool({"avx512_bf16", "amx_bf16"} & flags),
        "amx": bool({"amx_bf16", "amx_tile"} <= flags),
        "mem_total_bytes": _mem_total(_read(PROC_MEMINFO)),
        "load_avg": load_average(),
    }


def host_key(facts: dict[str, Any] | None) -> tuple:
    """A hashable summary of the machine in ``facts`` (the :data:`COMPARED_FIELDS`), for telling
    whether two shards ran on the same kind of host; ``()`` for no facts (old markers)."""
    if not facts:
        return ()
    return tuple(json.dumps(facts.get(k), sort_keys=True) for k in COMPARED_FIELDS)


def describe(facts: dict[str, Any] | None) -> str:
    """One line for humans, e.g. ``"AMD EPYC, 2 cores x 1 thread, L2 1 MiB, L3 32 MiB, bf16"``;
    ``""`` for no facts."""
    if not facts:
        return ""
    parts = [str(facts.get("cpu_model") or "?"),
             f"{facts.get('logical_cores')} cores x {facts.get('threads_per_core') or '?'} thread"]
    for level in (2, 3):
        size = cache_bytes(facts, level)
        if size:
            parts.append(f"L{level} {size / (1 << 20):g} MiB")
    if facts.get("amx"):
        parts.append("AMX")
    elif facts.get("bf16"):
        parts.append("bf16")
    return ", ".join(parts)
