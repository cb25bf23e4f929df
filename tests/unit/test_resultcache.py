"""Result cache (``batch_contract.resultcache``) and the fingerprint parts that key it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from batch_contract import resultcache, storage
from batch_contract.engine_config import ConfigError, WorkerSettings
from batch_contract.layout import chunk_of, is_reused_part, join_uri, part_name
from batch_contract.manifest import config_fingerprint, result_fingerprint
from batch_contract.schemas import part_schema

FP = "f" * 32


def _part(ids: list[str], fp: str = FP, dim: int = 4) -> pa.Table:
    schema = part_schema("embedding", dim)
    n = len(ids)
    return pa.table({"id": ids, "fingerprint": [fp] * n, "n_tokens": pa.array(range(1, n + 1), pa.int32()),
                     "truncated": [False] * n, "text_repaired": [False] * n,
                     "embedding": [[float(i)] * dim for i in range(n)]}, schema=schema)


def _write(root: str, texts: list[str], fp: str = FP) -> str:
    """Append one cache file of ``texts`` to the log; its URI."""
    part = _part([f"id{i}" for i in range(len(texts))], fp)
    table = resultcache.cache_table(part, resultcache.text_keys(texts), pa.array([0.5] * len(texts)))
    name = resultcache.append_entries(root, fp, table, resultcache.origin_of("run", "00000", "part-x"))
    return join_uri(resultcache.cache_dir(root, fp), name)


def test_key_is_the_text_and_settings_outside_outputs_do_not_change_the_fingerprint() -> None:
    assert resultcache.text_key("abc") == resultcache.text_key("abc") != resultcache.text_key("abc ")
    assert len(resultcache.text_key("x")) == resultcache.KEY_BYTES
    base = {"kind": "encoder", "dtype": "float32"}
    assert config_fingerprint(base) == config_fingerprint({**base, "pad_to_multiple_of": 64})
    assert config_fingerprint(base) != config_fingerprint({**base, "pooling": "cls"})
    assert config_fingerprint(base) != config_fingerprint({**base, "dtype": "bfloat16"})
    cfp = config_fingerprint({"kind": "encoder"})  # dtype auto: the host's resolution decides
    assert result_fingerprint(cfp, "d") == result_fingerprint(cfp, "d", {})
    assert len({result_fingerprint(cfp, "d", {"dtype": "bfloat16"}), result_fingerprint(cfp, "d", {"dtype": "float32"}),
                result_fingerprint(cfp, "d"), result_fingerprint(cfp, "d2", {"dtype": "float32"})}) == 4
    assert WorkerSettings().reuse == "same_root"
    with pytest.raises(ConfigError, match="worker.reuse"):
        WorkerSettings(reuse="always")


def test_reused_part_names_are_part_files() -> None:
    name = part_name("part-", 7, reused=True)
    assert is_reused_part(name) and chunk_of(name) == 7
    assert not is_reused_part(part_name("part-", 7)) and not is_reused_part(part_name("dead-letter-", 7, reused=True))


def test_lookup_hits_misses_repeats_and_first_entry_wins(tmp_path: Path) -> None:
    root = str(tmp_path)
    _write(root, ["one", "two", "three"])
    _write(root, ["three", "four"])
    keys = resultcache.text_keys(["four", "zero", "one", "one", "three"])
    found = resultcache.lookup(root, FP, keys)
    assert found.row_hit.to_pylist()[1] is None and found.hits == 4
    rows = [found.table.slice(i, 1).to_pylist()[0] if i is not None else None for i in found.row_hit.to_pylist()]
    assert rows[2] == rows[3] and rows[2]["n_tokens"] == 1
    assert rows[4]["n_tokens"] == 3  # "three" from the first file of the log, not the second
    assert found.table.num_rows == len(set(found.table.column("key").to_pylist()))


def test_another_fingerprint_is_never_a_hit(tmp_path: Path) -> None:
    root = str(tmp_path)
    other = "e" * 32
    src = _write(root, ["one"], fp=other)
    assert resultcache.lookup(root, FP, resultcache.text_keys(["one"])).hits == 0
    # a file of another fingerprint copied into this fingerprint's directory is skipped, not used
    storage.makedirs(resultcache.cache_dir(root, FP))
    storage.write_create_only(join_uri(resultcache.cache_dir(root, FP), "stray.parquet"), storage.read_bytes(src))
    found = resultcache.lookup(root, FP, resultcache.text_keys(["one"]))
    assert found.hits == 0 and found.files_skipped == 1


def test_torn_file_is_quarantined_and_its_rows_are_misses(tmp_path: Path) -> None:
    root = str(tmp_path)
    uri = _write(root, ["one", "two"])
    second = _write(root, ["three"])
    data = Path(uri).read_bytes()
    Path(uri).write_bytes(data[: len(data) // 2])
    found = resultcache.lookup(root, FP, resultcache.text_keys(["one", "three"]))
    assert found.row_hit.to_pylist()[0] is None and found.hits == 1 and found.files_quarantined == 1
    assert storage.list_names(join_uri(resultcache.cache_dir(root, FP), "quarantine")) == [Path(uri).name]
    assert resultcache.cache_files(root, FP) == [Path(second).name]


def test_empty_or_missing_cache_is_all_misses(tmp_path: Path) -> None:
    found = resultcache.lookup(str(tmp_path), FP, resultcache.text_keys(["x", "y"]))
    assert found.hits == 0 and found.table is None and len(found.row_hit) == 2
