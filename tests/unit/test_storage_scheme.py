"""Adding a storage scheme is one backend plus one registry line: a ``mem://`` backend defined here (an
in-memory pyarrow filesystem, nothing on disk) is registered and real code paths run through it - object
API, allow-list, planner, worker, publish (localize, coverage) - without any other module knowing it."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from batch_contract import storage
from batch_contract.engine_config import ConfigError
from batch_contract.enums import EngineKind, ExitCode
from batch_contract.layout import TEMP_MARK, RunLayout
from batch_contract.marker import ShardMarker
from batch_contract.schemas import part_schema
from batch_contract.storage import AlreadyExistsError, StorageBackend, StorageError
from batch_contract.tokens import TokenCounts
from batch_worker.engines.base import ChunkOutput, Engine, LoadedModel
from hypothesis import assume, given, settings
from hypothesis import strategies as st


class MemBackend(StorageBackend):
    """``mem://bucket/key`` objects in a pyarrow in-memory filesystem (per instance). Create-only is a
    check-then-write, atomic enough for one test process."""

    scheme = "mem"

    def __init__(self) -> None:
        self.fs = pafs._MockFileSystem()

    def _path(self, uri: str) -> str:
        return uri[len("mem://"):].rstrip("/")

    def _info(self, uri: str) -> pafs.FileInfo:
        return self.fs.get_file_info(self._path(uri))

    def read_bytes(self, uri: str) -> bytes:
        if self._info(uri).type != pafs.FileType.File:
            raise FileNotFoundError(uri)
        with self.fs.open_input_stream(self._path(uri)) as fh:
            return fh.read()

    def write_create_only(self, uri: str, data: bytes) -> None:
        if self.exists(uri):
            if self.read_bytes(uri) != data:
                raise AlreadyExistsError(f"{uri} already exists with other content")
            return
        self.write_replace(uri, data)

    def write_replace(self, uri: str, data: bytes) -> None:
        path = self._path(uri)
        self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        with self.fs.open_output_stream(path) as fh:
            fh.write(data)

    def exists(self, uri: str) -> bool:
        return self._info(uri).type == pafs.FileType.File

    def _children(self, dir_uri: str) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(pafs.FileSelector(self._path(dir_uri), allow_not_found=True))

    def list_names(self, dir_uri: str) -> list[str]:
        return [i.base_name for i in self._children(dir_uri)]

    def list_sizes(self, dir_uri: str) -> dict[str, int]:
        return {i.base_name: i.size for i in self._children(dir_uri) if i.type == pafs.FileType.File}

    def delete(self, uri: str) -> None:
        if self.exists(uri):
            self.fs.delete_file(self._path(uri))

    def move(self, src: str, dst: str) -> None:
        if not self.exists(src):
            raise FileNotFoundError(src)
        self.write_replace(dst, self.read_bytes(src))
        self.delete(src)

    def arrow_filesystem(self, uri: str) -> tuple[pafs.FileSystem, str]:
        return self.fs, self._path(uri)


@pytest.fixture
def mem() -> Iterator[MemBackend]:
    backend = MemBackend()
    storage.register_backend("mem", backend)  # the one registry line (BACKENDS entry in a real module)
    yield backend
    storage.unregister_backend("mem")


def test_object_api_semantics(mem: MemBackend) -> None:
    uri = "mem://b/run/shards/00000/part-00000-x.parquet"
    storage.write_create_only(uri, b"one")
    storage.write_create_only(uri, b"one")  # retried commit, same bytes: no-op
    with pytest.raises(AlreadyExistsError, match=f"^{re.escape(uri)} already exists with other content"):
        storage.write_create_only(uri, b"two")
    assert storage.read_bytes(uri) == b"one" and storage.exists(uri)
    storage.write_replace("mem://b/run/shards/00000/_PROGRESS.json", b"{}")
    storage.write_replace(f"mem://b/run/shards/00000/{TEMP_MARK}x", b"partial")
    storage.write_replace("mem://b/run/shards/00000/quarantine/old.parquet", b"q")
    assert storage.list_names("mem://b/run/shards/00000/") == ["_PROGRESS.json", "part-00000-x.parquet",
                                                               "quarantine"]
    assert storage.list_sizes("mem://b/run/shards/00000") == {"_PROGRESS.json": 2, "part-00000-x.parquet": 3}
    assert storage.list_names("mem://b/missing") == [] and storage.clean_temp("mem://b/run") == 0
    storage.move(uri, "mem://b/run/shards/00000/quarantine/part-00000-x.parquet")
    assert not storage.exists(uri)
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(uri)
    with pytest.raises(FileNotFoundError):
        storage.move(uri, "mem://b/elsewhere")
    with pytest.raises(StorageError, match="^mem://b/run/shards/00000/_PROGRESS.json -> /tmp/x: a move stays within "
                                           "one storage backend"):
        storage.move("mem://b/run/shards/00000/_PROGRESS.json", "/tmp/x")
    storage.delete("mem://b/run/shards/00000/_PROGRESS.json")
    storage.delete("mem://b/run/shards/00000/_PROGRESS.json")  # missing: no-op
    assert not storage.is_local(uri)
    with pytest.raises(StorageError, match=f"^{re.escape(uri)}: not a local path or file:// URI"):
        storage.local_path(uri)
    storage.unregister_backend("mem")
    with pytest.raises(StorageError, match=f"^{re.escape(uri)}: no storage backend for scheme 'mem'"):
        storage.read_bytes(uri)


def test_arrow_filesystem_reads_parquet_and_localize_copies(mem: MemBackend, tmp_path: Path) -> None:
    from batch_inference.publish.files import localize

    table = pa.table({"id": ["a", "b"], "x": [1, 2]})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    uri = "mem://b/out/runs/r/shards/00001/part-00000-x.parquet"
    storage.write_create_only(uri, buf.getvalue())
    fs, path = storage.arrow_filesystem(uri)
    assert pq.read_table(path, filesystem=fs).equals(table)
    [local] = localize([uri], tmp_path / "work")
    assert local == str(tmp_path / "work" / "00001" / "part-00000-x.parquet")
    assert pq.read_table(local).equals(table)
    own = tmp_path / "own.parquet"
    pq.write_table(table, own)
    assert localize([f"file://{own}"], tmp_path / "unused") == [str(own.resolve())]


def test_allow_list_and_shared_storage_go_through_the_backend(mem: MemBackend, tmp_path: Path) -> None:
    from batch_inference.params import ALLOWED_ROOTS_ENV, allowed_roots, check_allowed_location

    roots = allowed_roots({ALLOWED_ROOTS_ENV: f"mem://b/out/, {tmp_path}"})
    assert roots == ["mem://b/out", str(Path(tmp_path).resolve())]
    check_allowed_location("output_root", "mem://b/out/x/../y", roots)
    check_allowed_location("output_root", "mem://b/out", roots)
    for outside in ("mem://b/outside", "mem://b/out/../etc", "mem://c/out", f"{tmp_path}/../x"):
        with pytest.raises(ConfigError, match=rf"^params\.output_root: {re.escape(repr(outside))} .*is outside the storage roots this DAG may use; a deployment"):
            check_allowed_location("output_root", outside, roots)
    with pytest.raises(ConfigError, match=r"^params\.output_root: oss://b/out: no storage backend for scheme 'oss'"):
        check_allowed_location("output_root", "oss://b/out", roots)
    assert storage.is_under("mem://b/out/a", "mem://b/out") and not storage.is_under(f"{tmp_path}/a", "mem://b")
    assert not storage.backend_for("mem://b/x").shared  # the kubernetes runner refuses it (params)


class _LengthEngine(Engine):
    """Engine stand-in: a 2-dim 'embedding' from the text length (no model)."""

    kind = EngineKind.ENCODER

    def model_digest(self) -> str:
        return "tiny"

    def load(self) -> LoadedModel:
        return LoadedModel("tiny", {"engine": "tiny"}, part_schema("embedding", 2))

    def process(self, prepared, should_stop) -> ChunkOutput:
        n = len(prepared)
        if self.on_rows_done:
            self.on_rows_done(n)
        table = pa.table({
            "id": pa.array(prepared.ids, pa.string()),
            "n_tokens": pa.array([len(t) for t in prepared.texts], pa.int32()),
            "truncated": pa.array([False] * n),
            "embedding": pa.array([[float(len(t)), 1.0] for t in prepared.texts], pa.list_(pa.float32(), 2)),
        })
        return ChunkOutput(table=table, rejects=[], interrupted=False, tokens=TokenCounts(real=n, padded=n))


def test_plan_run_publish_on_the_new_scheme(mem: MemBackend, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from batch_inference.planned import manifest_for
    from batch_inference.planner import PlanRequest, plan
    from batch_inference.publish import PublishTarget, publish_run
    from batch_worker import runtime

    rows = 25
    for name, lo, hi in (("a.parquet", 0, 10), ("b.parquet", 10, rows)):
        buf = io.BytesIO()
        pq.write_table(pa.table({"id": [f"id{i}" for i in range(lo, hi)],
                                 "text": [f"text {i} " + "w" * i for i in range(lo, hi)]}), buf)
        storage.write_create_only(f"mem://b/in/{name}", buf.getvalue())
    request = PlanRequest(input_uri="mem://b/in/", id_column="id", text_column="text", output_root="mem://b/out",
                          run_id="r1", engine={"kind": "encoder"}, rows_per_shard=10)
    manifest, refs = plan(request)
    assert [f.uri for f in manifest.input.files] == ["mem://b/in/a.parquet", "mem://b/in/b.parquet"]
    run_dir = RunLayout("mem://b/out", "r1").run_dir
    assert manifest_for(run_dir) == manifest and plan(request)[0] == manifest  # committed once, reused
    assert [r["run_dir"] for r in refs] == [run_dir] * len(manifest.shards) == [run_dir] * 3

    monkeypatch.setattr(runtime, "engine_class", lambda kind: _LengthEngine)
    for ref in refs:
        assert runtime.run_shard(run_dir, ref["shard_id"]) == ExitCode.OK
    layout = RunLayout.from_run_dir(run_dir)
    markers = [ShardMarker.from_json_bytes(storage.read_bytes(layout.marker_uri(r["shard_id"]))) for r in refs]
    assert sum(m.rows_ok for m in markers) == rows
    assert all(m.parts and set(m.parts) <= set(storage.list_names(layout.shard_dir(m.shard_id))) for m in markers)

    summary = publish_run(run_dir, PublishTarget(backend="duckdb", table="mem_test",
                                                 duckdb_path=str(tmp_path / "w.duckdb")))
    assert summary["rows_published"] == rows and summary["rows_missing"] == 0
    assert not list(tmp_path.rglob("*.parquet"))  # nothing of the run touched the local disk but DuckDB


KNOWN_SCHEMES = sorted(s for s in storage.BACKENDS if s)


@settings(max_examples=200, deadline=None)
@given(scheme=st.sampled_from(KNOWN_SCHEMES), upper=st.lists(st.booleans(), min_size=5, max_size=5),
       separator=st.sampled_from([":", ":/", ":\\\\", ": //", ":/ /"]),
       rest=st.text(alphabet="abc/._-", min_size=0, max_size=12))
def test_a_known_scheme_without_its_double_slash_is_refused_not_taken_for_a_folder(
        scheme: str, upper: list[bool], separator: str, rest: str) -> None:
    """``make run OUTPUT=s3:/demo/out`` once wrote to a local folder ``./s3:``: every known scheme followed
    by a colon but not ``://``, in any case, is refused; the same scheme in any case with ``://``
    dispatches to the scheme's backend."""
    assume(not f"{separator}{rest}".startswith("://"))  # that is the scheme written right
    cased = "".join(c.upper() if u else c for c, u in zip(scheme, upper * 3, strict=False))
    with pytest.raises(storage.StorageError, match="malformed separator"):
        storage.backend_for(f"{cased}{separator}{rest}")
    assert storage.scheme_of(f"{cased}://bucket/x") == scheme
    assert storage.backend_for(f"{cased}://bucket/x") is storage.backend_for(f"{scheme}://bucket/x")


@pytest.mark.parametrize("path", ["notes:2024/x", "./s3:/x", "/tmp/a:b", "data/gs:x"])
def test_a_colon_elsewhere_in_a_local_path_is_still_a_path(path: str) -> None:
    assert storage.scheme_of(path) == "" and storage.is_local(path)


@pytest.mark.parametrize("uri", ["GS://b/a/../c", "Gs://b/a/./c/"])
def test_upper_case_gs_and_file_uris_normalize_like_lower_case(uri: str, tmp_path) -> None:
    assert storage.normalize(uri) == "gs://b/c" if ".." in uri else storage.normalize(uri) == "gs://b/a/c"
    assert storage.normalize(f"FILE://{tmp_path}") == storage.normalize(str(tmp_path))
