"""The result cache's log (``batch_contract.resultcache``): gap-free appends in creation order, and one
winner per key that every writer agrees on, whatever the interleaving of concurrent writers."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from batch_contract import resultcache
from batch_contract.layout import join_uri
from batch_contract.schemas import part_schema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FP = "f" * 32
DIM = 2


def _table(keys: list[bytes], value: float) -> pa.Table:
    """A cache table whose rows all carry ``value`` (so a row's writer can be told from its bytes)."""
    n = len(keys)
    part = pa.table({"id": [f"r{i}" for i in range(n)], "fingerprint": [FP] * n,
                     "n_tokens": pa.array([1] * n, pa.int32()), "truncated": [False] * n,
                     "text_repaired": [False] * n, "embedding": [[value] * DIM for _ in range(n)]},
                    schema=part_schema("embedding", DIM))
    return resultcache.cache_table(part, pa.array(keys, resultcache.KEY_TYPE), pa.array([0.1] * n))


def _key(i: int) -> bytes:
    return resultcache.text_key(f"text {i}")


def test_concurrent_appends_fill_the_log_without_gaps_in_creation_order(tmp_path: Path) -> None:
    root = str(tmp_path)
    made: list[tuple[int, str]] = []
    lock = threading.Lock()

    def writer(w: int) -> None:
        for c in range(6):
            name = resultcache.append_entries(root, FP, _table([_key(w)], float(w)), f"w{w}/c{c}")
            with lock:
                made.append((w, name))

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = resultcache.cache_files(root, FP)
    assert names == [resultcache.entry_name(i) for i in range(30)]
    assert sorted(n for _, n in made) == names, "every append got its own file"
    for w in range(5):  # one writer's files are in the order it wrote them
        own = [n for ww, n in made if ww == w]
        assert own == sorted(own)
    origins = {pq.read_schema(join_uri(resultcache.cache_dir(root, FP), n)).metadata[resultcache.ORIGIN_KEY]
               for n in names}
    assert len(origins) == 30


def test_old_layout_files_come_before_the_log(tmp_path: Path) -> None:
    assert sorted(["000000000001.parquet", "zz.0.part-1.parquet", "000000000000.parquet", "a.0.part-2.parquet"],
                  key=resultcache.log_order) == ["a.0.part-2.parquet", "zz.0.part-1.parquet",
                                                 "000000000000.parquet", "000000000001.parquet"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=5), min_size=1, max_size=4),
                min_size=2, max_size=4))
def test_every_writer_publishes_the_first_committed_result_of_each_key(workers: list[list[list[int]]]) -> None:
    """Writers append chunks concurrently, each then reads the log up to its own file and takes each
    key's winner: every writer ends with the same value per key, the value of the lowest file holding it."""
    with tempfile.TemporaryDirectory() as root:
        published: dict[int, set[float]] = {}
        lock = threading.Lock()
        barrier = threading.Barrier(len(workers))

        def writer(w: int, chunks: list[list[int]]) -> None:
            result_log = resultcache.ResultLog(root, FP, [_key(k) for c in chunks for k in c])
            barrier.wait()
            for c, chunk in enumerate(chunks):
                value = float(w * 100 + c)
                name = resultcache.append_entries(root, FP, _table([_key(k) for k in chunk], value), f"w{w}/c{c}")
                result_log.advance(until=name)
                for k in chunk:
                    winner = result_log.winner(_key(k))
                    assert winner is not None and resultcache.log_order(winner) <= resultcache.log_order(name)
                    got = value if winner == name else result_log.fetch([_key(k)]).column("embedding")[0].as_py()[0]
                    with lock:
                        published.setdefault(k, set()).add(got)

        threads = [threading.Thread(target=writer, args=(w, chunks)) for w, chunks in enumerate(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        first: dict[int, float] = {}
        directory = resultcache.cache_dir(root, FP)
        for name in resultcache.cache_files(root, FP):
            table = pq.read_table(join_uri(directory, name))
            for key, emb in zip(table.column("key").to_pylist(), table.column("embedding").to_pylist(), strict=True):
                k = next(i for i in range(8) if _key(i) == key)
                first.setdefault(k, emb[0])
        assert {k: v for k, v in published.items()} == {k: {first[k]} for k in published}


def test_a_log_tracking_new_keys_rereads_the_files_it_already_passed(tmp_path: Path) -> None:
    root = str(tmp_path)
    resultcache.append_entries(root, FP, _table([_key(1)], 1.0), "a")
    resultcache.append_entries(root, FP, _table([_key(2)], 2.0), "b")
    result_log = resultcache.ResultLog(root, FP, [_key(2)])
    result_log.advance()
    result_log.track([_key(1), None])
    assert result_log.winner(_key(1)) == resultcache.entry_name(0)
    assert result_log.fetch([_key(1), _key(2), _key(3)]).column("embedding").to_pylist() == [[1.0, 1.0], [2.0, 2.0]]
