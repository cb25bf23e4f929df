"""Host facts (batch_contract.hostinfo): parsing of sysfs/procfs text, and the facts of this machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from batch_contract import hostinfo


@pytest.mark.parametrize(("text", "expected"), [("48K", 48 << 10), ("2048K\n", 2 << 20), ("105M", 105 << 20),
                                                 ("512", 512), ("", None), ("abcK", None)])
def test_parse_size(text: str, expected: int | None) -> None:
    assert hostinfo.parse_size(text) == expected


def _cache(root: Path, name: str, level: int, kind: str, size: str, shared: str) -> None:
    d = root / name
    d.mkdir(parents=True)
    for field, value in (("level", str(level)), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
        (d / field).write_text(value + "\n")


def test_cache_levels_read_a_sysfs_tree(tmp_path: Path) -> None:
    # the other host of issue #22: L1d 48 KiB and L2 2 MiB per core, L3 105 MiB shared by both cores
    _cache(tmp_path, "index0", 1, "Data", "48K", "0")
    _cache(tmp_path, "index1", 1, "Instruction", "32K", "0")
    _cache(tmp_path, "index2", 2, "Unified", "2048K", "0")
    _cache(tmp_path, "index3", 3, "Unified", "107520K", "0-1")
    (tmp_path / "index9").mkdir()  # an entry without files is skipped, not a crash
    caches = hostinfo.cache_levels(tmp_path)
    assert [(c["level"], c["type"], c["shared_by"]) for c in caches] == [
        (1, "Data", 1), (1, "Instruction", 1), (2, "Unified", 1), (3, "Unified", 2)]
    facts = {"caches": caches}
    assert hostinfo.cache_bytes(facts, 1) == 48 << 10
    assert hostinfo.cache_bytes(facts, 2) == 2 << 20
    assert hostinfo.cache_bytes(facts, 3) == 105 << 20
    assert hostinfo.cache_bytes({}, 2) is None


def test_host_facts_of_this_machine_are_json_and_self_consistent() -> None:
    facts = hostinfo.host_facts()
    assert json.loads(json.dumps(facts)) == facts
    assert facts["logical_cores"] >= 1 and 1 <= facts["usable_cores"] <= facts["logical_cores"]
    assert facts["amx"] <= facts["bf16"] or "amx_bf16" not in facts["cpu_flags"]
    assert set(facts["cpu_flags"]) <= set(hostinfo.CPU_FLAGS)
    if Path("/proc/cpuinfo").is_file():
        flags = Path("/proc/cpuinfo").read_text()
        assert facts["bf16"] == ("avx512_bf16" in flags or "amx_bf16" in flags)
        assert facts["mem_total_bytes"] > 0 and len(facts["load_avg"]) == 3


def test_host_key_ignores_load_and_tells_machines_apart() -> None:
    facts = hostinfo.host_facts()
    busier = dict(facts, load_avg=[99.0, 99.0, 99.0])
    other = dict(facts, caches=[{"level": 2, "type": "Unified", "size_bytes": 2 << 20, "shared_by": 1}], amx=True)
    assert hostinfo.host_key(busier) == hostinfo.host_key(facts)
    assert hostinfo.host_key(other) != hostinfo.host_key(facts)
    assert hostinfo.host_key({}) == () and hostinfo.describe({}) == ""
    assert "L2 2 MiB" in hostinfo.describe(other) and "AMX" in hostinfo.describe(other)
