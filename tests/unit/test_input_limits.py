"""Input guards: allowed roots checked per file (planner and worker), linear JSONL lines with a byte cap,
a cap on Parquet row-group size (issue #38, input side).

* ``iter_jsonl_lines`` equals the plain ``split(b"\\n")`` rule for every block size, is linear in the line
  length and replaces a line over ``max_line_bytes`` by an :class:`OversizedLine` that still counts as a row.
* ``row_group_read_bytes`` counts only the columns read.
* ``storage.list_tree`` / ``check_under_roots`` / ``open_input_file`` follow links but refuse what resolves
  outside the roots, without naming the roots or a link's target.
* The planner and the worker's reader apply all three; the manifest records the roots.
"""

from __future__ import annotations

import io
import json
import os
import time
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract import storage
from batch_contract.engine_config import (
    DEFAULT_MAX_LINE_BYTES,
    DEFAULT_MAX_ROW_GROUP_BYTES,
    ConfigError,
    WorkerSettings,
)
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec
from batch_contract.rows import OversizedLine, iter_jsonl_lines, row_group_read_bytes
from batch_inference.planner import PlanError, PlanRequest, plan, resolve_input_files
from batch_worker.errors import BadInputError
from batch_worker.reader import iter_shard_blocks
from hypothesis import given, settings
from hypothesis import strategies as st

ENGINE = {"kind": "encoder"}


def _reference(data: bytes, cap: int | None) -> list[tuple[int, bytes, int | None]]:
    """``(row, line, oversized length)`` by the plain rule: split on ``\\n``, drop blank lines."""
    out = []
    for line in data.split(b"\n"):
        if line.strip():
            over = cap is not None and len(line) > cap
            out.append((len(out), b"" if over else line, len(line) if over else None))
    return out


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=60).map(lambda b: bytes(c % 6 for c in b).translate(bytes.maketrans(
           b"\x00\x01\x02\x03\x04\x05", b"a \n\r\t{"))),
       block=st.integers(1, 70), cap=st.one_of(st.none(), st.integers(0, 12)))
def test_jsonl_lines_match_the_plain_rule_for_any_block_size_and_cap(data: bytes, block: int, cap: int | None) -> None:
    got = [(row, bytes(line), getattr(line, "length", None)) for row, line in iter_jsonl_lines(io.BytesIO(data), block, cap)]
    assert got == _reference(data, cap)
    assert all(isinstance(line, OversizedLine) == (length is not None)
               for (_, _, length), (_, line) in zip(got, iter_jsonl_lines(io.BytesIO(data), block, cap), strict=True))


def test_a_32_mib_line_is_split_in_linear_time_and_bounded_memory() -> None:
    line = b'{"id": "big", "text": "' + b"x" * (32 << 20) + b'"}'
    data = io.BytesIO(line + b'\n{"id": "small", "text": "t"}\n')
    tracemalloc.start()
    t0 = time.perf_counter()
    got = list(iter_jsonl_lines(data, 64 << 10, max_line_bytes=1 << 20))  # 512 reads for the big line
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [row for row, _ in got] == [0, 1]
    assert isinstance(got[0][1], OversizedLine) and got[0][1].length == len(line) and got[0][1] == b""
    assert got[1][1] == b'{"id": "small", "text": "t"}'
    assert peak < 4 << 20, f"held {peak} bytes for a 1 MiB cap"
    assert seconds < 2.0, f"{seconds:.2f} s: not linear"


def test_an_over_long_blank_line_stays_blank() -> None:
    data = b" " * 5000 + b"\n" + b"\t" * 3000 + b"\n{}\n"
    assert list(iter_jsonl_lines(io.BytesIO(data), 100, 10)) == [(0, b"{}")]


def test_worker_settings_caps_have_defaults_and_are_checked() -> None:
    settings_ = WorkerSettings()
    assert (settings_.max_line_bytes, settings_.max_row_group_bytes) == (8 << 20, 256 << 20)
    assert (DEFAULT_MAX_LINE_BYTES, DEFAULT_MAX_ROW_GROUP_BYTES) == (8 << 20, 256 << 20)
    assert WorkerSettings.from_dict({"max_line_bytes": 1024}).max_line_bytes == 1024
    with pytest.raises(ConfigError, match=r"^worker\.max_line_bytes: must be >= 1"):
        WorkerSettings(max_line_bytes=0)
    with pytest.raises(ConfigError, match=r"^worker\.max_row_group_bytes: must be >= 1"):
        WorkerSettings(max_row_group_bytes=-5)
    with pytest.raises(ConfigError, match=r"^worker\.max_line_bytes: '8' is not int"):
        WorkerSettings.from_dict({"max_line_bytes": "8"})


# ----------------------------------------------------------------------------------------- row groups


def test_row_group_read_bytes_counts_only_the_columns_read(tmp_path: Path) -> None:
    n = 1000
    table = pa.table({"id": list(range(n)), "blob": ["b" * 1000] * n, "text": ["t" * 10] * n,
                      "nested": [{"a": 1, "b": "x" * 50}] * n})
    pq.write_table(table, tmp_path / "f.parquet", row_group_size=500, compression="zstd")
    pf = pq.ParquetFile(tmp_path / "f.parquet")
    meta = pf.metadata
    per_leaf = [[meta.row_group(g).column(j).total_uncompressed_size for j in range(meta.num_columns)]
                for g in range(meta.num_row_groups)]
    assert row_group_read_bytes(meta, pf.schema_arrow, ["id", "text"]) == [r[0] + r[2] for r in per_leaf]
    assert row_group_read_bytes(meta, pf.schema_arrow, ["nested", "missing"]) == [r[3] + r[4] for r in per_leaf]
    assert row_group_read_bytes(meta, pa.schema([("x", pa.int64())]), ["x"]) == [sum(r) for r in per_leaf], \
        "a schema that does not line up counts every column"


# -------------------------------------------------------------------------------------- storage + roots


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """``root/in`` (a.jsonl, sub/b.jsonl, a loop link, a link to a sibling inside the root) and
    ``outside/`` (secret.jsonl, dir/c.jsonl)."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "in" / "sub").mkdir(parents=True)
    (root / "other").mkdir()
    (outside / "dir").mkdir(parents=True)
    for p in (root / "in" / "a.jsonl", root / "in" / "sub" / "b.jsonl", root / "other" / "o.jsonl",
              outside / "secret.jsonl", outside / "dir" / "c.jsonl"):
        p.write_text('{"id": "x", "text": "y"}\n')
    (root / "in" / "sub" / "loop").symlink_to(root / "in")
    (root / "in" / "sub" / "loop2").symlink_to(root / "in")
    (root / "in" / "sibling").symlink_to(root / "other")
    return {"root": root, "outside": outside, "in": root / "in"}


def test_list_tree_lists_each_real_directory_once(tree: dict[str, Path]) -> None:
    files = sorted(Path(p).name for p in storage.list_tree(str(tree["in"]), [str(tree["root"])]))
    assert files == ["a.jsonl", "b.jsonl", "o.jsonl"], "loops listed once, links inside the root followed"
    assert storage.list_tree(str(tree["root"] / "absent")) == []


def test_list_tree_refuses_a_directory_link_out_of_the_roots(tree: dict[str, Path]) -> None:
    (tree["in"] / "escape").symlink_to(tree["outside"] / "dir")
    with pytest.raises(storage.InputRefusedError, match=r"/in/escape: a directory that resolves outside") as info:
        storage.list_tree(str(tree["in"]), [str(tree["root"])])
    assert str(tree["root"]) not in str(info.value).replace(str(tree["in"]), "<in>")
    assert "outside/dir" not in str(info.value), "the link's target is not shown"
    assert len(storage.list_tree(str(tree["in"]))) == 4, "no roots: no check"


def test_check_under_roots_and_open_input_refuse_a_file_link_out(tree: dict[str, Path]) -> None:
    link = tree["in"] / "link.jsonl"
    link.symlink_to(tree["outside"] / "secret.jsonl")
    roots = [str(tree["root"])]
    with pytest.raises(storage.InputRefusedError, match=r"link\.jsonl: lies outside the allowed input locations"):
        storage.check_under_roots(str(link), roots)
    with pytest.raises(storage.InputRefusedError, match=r"link\.jsonl: resolves outside the allowed input locations"):
        storage.open_input_stream(str(link), roots)
    storage.check_under_roots(str(link), [])  # no roots: no check
    with storage.open_input_file(str(tree["in"] / "a.jsonl"), roots) as fh:
        assert fh.read().startswith(b'{"id"')
    with storage.open_input_file(f"file://{tree['in'] / 'sibling' / 'o.jsonl'}", roots) as fh:
        assert fh.size() > 0, "a link that stays inside the roots is read"


def test_open_input_refuses_a_fifo_without_blocking(tree: dict[str, Path]) -> None:
    fifo = tree["in"] / "pipe.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(storage.InputRefusedError, match=r"pipe\.jsonl: not a regular file"):
        storage.open_input_stream(str(fifo))


def test_content_tag_never_reads_a_fifo_or_device(tree: dict[str, Path]) -> None:
    os.mkfifo(tree["in"] / "pipe.jsonl")
    (tree["in"] / "zero.jsonl").symlink_to("/dev/zero")
    assert storage.content_tag(str(tree["in"] / "pipe.jsonl")) is None
    assert storage.content_tag(str(tree["in"] / "zero.jsonl")) is None, "cannot tell: never carried over"
    assert storage.content_tag(str(tree["in"] / "a.jsonl")).startswith("size=25;sha256=")


def test_gs_roots_compare_object_prefixes() -> None:
    storage.check_under_roots("gs://b/in/x.parquet", ["gs://b/in"])
    for outside in ("gs://b/inx/x.parquet", "gs://b/in/../etc/x.parquet", "gs://c/in/x.parquet", "/in/x.parquet"):
        with pytest.raises(storage.InputRefusedError, match="lies outside the allowed input locations"):
            storage.check_under_roots(outside, ["gs://b/in"])


# ------------------------------------------------------------------------------------------- manifest


def _manifest(roots: list[str]) -> Manifest:
    return Manifest(run_id="r", input=InputSpec(uri="/d", format="jsonl", id_column="id", text_column="text",
                                                 files=[InputFile(uri="/d/a.jsonl", rows=1)], roots=roots),
                    shards=[ShardSpec("00000", [Segment(0, 0, 1)])], engine=ENGINE)


def test_manifest_records_roots_and_stays_as_before_without_them() -> None:
    with_roots = _manifest(["/d", "gs://b/in"])
    assert Manifest.from_json_bytes(with_roots.to_json_bytes()) == with_roots
    assert json.loads(with_roots.to_json_bytes())["input"]["roots"] == ["/d", "gs://b/in"]
    plain = _manifest([])
    assert "roots" not in json.loads(plain.to_json_bytes())["input"], "older readers still accept it"
    old = json.loads(plain.to_json_bytes())
    assert Manifest.from_dict(old).input.roots == []
    with pytest.raises(ConfigError, match=r"^input\.roots: must be a list"):
        _manifest([""])


# -------------------------------------------------------------------------------------------- planner


def _request(tmp_path: Path, input_uri: str, run_id: str = "r", **kw) -> PlanRequest:
    return PlanRequest(input_uri=input_uri, id_column="id", text_column="text", output_root=str(tmp_path / "out"),
                       run_id=run_id, engine=kw.pop("engine", ENGINE), **kw)


def test_plan_request_input_roots_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"^input_roots: must be a list of non-empty"):
        PlanRequest(input_uri="x", id_column="id", text_column="text", output_root="o", run_id="r",
                    engine=ENGINE, input_roots=[""])


def test_planner_checks_every_file_and_records_the_roots(tree: dict[str, Path], tmp_path: Path) -> None:
    manifest, _ = plan(_request(tmp_path, str(tree["in"]), input_roots=[str(tree["root"])]))
    assert manifest.input.roots == [str(tree["root"])]
    assert sorted(Path(f.uri).name for f in manifest.input.files) == ["a.jsonl", "b.jsonl", "o.jsonl"]
    (tree["in"] / "z_link.jsonl").symlink_to(tree["outside"] / "secret.jsonl")
    with pytest.raises(PlanError, match=r"^input_uri: .*z_link\.jsonl: lies outside the allowed input locations"):
        resolve_input_files(str(tree["in"]), [str(tree["root"])])
    assert len(resolve_input_files(str(tree["in"]))[1]) == 4, "no roots: the existing behaviour"
    with pytest.raises(PlanError, match=r"^input_uri: .*lies outside the allowed input locations"):
        resolve_input_files(str(tree["outside"] / "secret.jsonl"), [str(tree["root"])])


def test_planner_counts_an_over_long_jsonl_line_as_a_row(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"id": "a", "text": "' + b"x" * 5000 + b'"}\n{"id": "b", "text": "y"}\n')
    manifest, _ = plan(_request(tmp_path, str(src), worker={"max_line_bytes": 1000}))
    assert manifest.rows == 2 and manifest.worker.max_line_bytes == 1000


def test_planner_refuses_an_oversized_row_group_naming_file_and_size(tmp_path: Path) -> None:
    src = tmp_path / "big.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["x" * 600_000, "y"]}), src)
    with pytest.raises(PlanError, match=r"^input: .*big\.parquet row group 0 holds \d+ bytes \(uncompressed\) .*"
                                        r"above worker\.max_row_group_bytes \(500000\)"):
        plan(_request(tmp_path, str(src), worker={"max_row_group_bytes": 500_000}))
    plan(_request(tmp_path, str(src), run_id="ok", worker={"max_row_group_bytes": 2_000_000}))


def test_planner_counts_template_columns_but_not_unused_ones(tmp_path: Path) -> None:
    src = tmp_path / "wide.parquet"
    pq.write_table(pa.table({"id": ["a"], "text": ["t"], "unused": ["u" * 600_000], "title": ["t" * 600_000]}), src)
    limit = {"max_row_group_bytes": 500_000}
    plan(_request(tmp_path, str(src), run_id="enc", worker=limit))  # the encoder reads id and text only
    llm = {"kind": "llm", "model_path": "/m", "max_tokens": 8, "user_template": "{{ title }}: {{ text }}"}
    with pytest.raises(PlanError, match=r"row group 0 holds"):
        plan(_request(tmp_path, str(src), run_id="llm", engine=llm, worker=limit))


# --------------------------------------------------------------------------------------------- reader


def _spec(path: Path, fmt: str, rows: int, roots: list[str] | None = None) -> InputSpec:
    return InputSpec(uri=str(path), format=fmt, id_column="id", text_column="text",
                     files=[InputFile(uri=str(path), rows=rows)], roots=roots or [])


def test_reader_dead_letters_an_over_long_line_by_position(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"id": "a", "text": "ok"}\n{"id": "b", "text": "' + b"x" * 5000 + b'"}\n{"id": "c", "text": "z"}\n')
    blocks = list(iter_shard_blocks(_spec(src, "jsonl", 3), [Segment(0, 0, 3)], 10,
                                    settings=WorkerSettings(max_line_bytes=1000)))
    assert [b.source_rows for b in blocks] == [[0, 1, 2]]
    assert blocks[0].ids == ["a", None, "c"]
    assert blocks[0].record_errors[1] == "line is 5023 bytes, above worker.max_line_bytes; not read " \
                                         "(split the record or raise the limit)"
    assert blocks[0].record_errors[0] is None and blocks[0].record_errors[2] is None


def test_reader_ends_a_jsonl_block_at_max_row_group_bytes(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": str(i), "text": "t" * 90}) + "\n" for i in range(10)))
    blocks = list(iter_shard_blocks(_spec(src, "jsonl", 10), [Segment(0, 0, 10)], 100,
                                    settings=WorkerSettings(max_row_group_bytes=250)))
    assert [len(b) for b in blocks] == [3, 3, 3, 1]


def test_reader_refuses_an_oversized_row_group(tmp_path: Path) -> None:
    src = tmp_path / "big.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["x" * 600_000, "y"]}), src)
    with pytest.raises(BadInputError, match=r"big\.parquet: row group 0 holds \d+ bytes .*max_row_group_bytes \(500000\)"):
        list(iter_shard_blocks(_spec(src, "parquet", 2), [Segment(0, 0, 2)], 10,
                               settings=WorkerSettings(max_row_group_bytes=500_000)))
    assert sum(len(b) for b in iter_shard_blocks(_spec(src, "parquet", 2), [Segment(0, 0, 2)], 10)) == 2


def test_reader_refuses_a_file_outside_the_manifest_roots(tree: dict[str, Path]) -> None:
    link = tree["in"] / "link.jsonl"
    link.symlink_to(tree["outside"] / "secret.jsonl")
    spec = _spec(link, "jsonl", 1, roots=[str(tree["root"])])
    with pytest.raises(BadInputError, match=r"^input: .*link\.jsonl: resolves outside the allowed input "
                                            r"locations .*; refusing to read it$") as info:
        list(iter_shard_blocks(spec, [Segment(0, 0, 1)], 10))
    assert str(tree["root"]) + "'" not in str(info.value) and "secret" not in str(info.value)
    assert len(next(iter_shard_blocks(_spec(link, "jsonl", 1), [Segment(0, 0, 1)], 10))) == 1, "no roots: read"


def test_a_glob_without_a_fixed_directory_is_refused_instead_of_looping() -> None:
    with pytest.raises(PlanError, match=r"^input_uri: \*\.jsonl has a wildcard in its first path segment"):
        resolve_input_files("*.jsonl")
