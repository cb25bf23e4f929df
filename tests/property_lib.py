"""Property-test helpers: generated bad inputs, the spec oracle, and the whole path (plan -> worker -> publish).

Pieces:

* hypothesis strategies (:func:`datasets`) for small inputs (1-25 rows, or a 200-line JSONL prefix plus a
  few rows when the planner's sampled lines must be passed): Parquet or JSONL, integer or string ids with
  odd Unicode, null / blank / duplicate ids, null / empty / whitespace / long / odd texts, an unused
  ``section`` column with weird values; in ``broken`` mode also lone UTF-16 surrogate escapes (``\\ud800``
  written raw into a JSONL line), invalid UTF-8 bytes (JSONL lines, Parquet binary text) and unparsable
  lines. Each dataset carries a random ``rows_per_shard``, worker chunking and kill plan.
* :func:`write_dataset` writes the files; :func:`expected_plan_error` and :func:`expected_outcome` are the
  oracle (the spec, not the code): which inputs the planner must reject as a whole, and per input row
  ``(source_uri, source_row)`` its dead-letter reason or its result (id, flags).
* :func:`run_whole_path` plans with the real planner, runs every shard with the real worker in-process
  (``ShardRun``, real MiniLM), optionally killing it at chosen commits, and publishes into DuckDB with
  the real ``publish_run``; :class:`Published` is what the live tables hold afterwards.

Kills are simulated in-process at the worker's commit call (``batch_worker.runtime.commit_table``):
``before`` (dies while writing: a stray temp file, nothing committed), ``after`` (dies right after the
commit) or ``term`` (a SIGTERM-like stop request: the worker finishes the chunk and exits 75). A hard
kill is an exception that unwinds the attempt (the worker only rewrites its attempt record); the next
attempt resumes from storage like a restarted pod.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from batch_contract import storage
from batch_contract.enums import DeadLetterReason, ExitCode
from batch_contract.layout import DEAD_LETTER_PREFIX, TEMP_MARK, RunLayout, chunk_of, join_uri
from hypothesis import strategies as st

ENGINE = {"kind": "encoder", "dtype": "float32"}
JSONL_SAMPLE_LINES = 200
"""Lines per JSONL file the planner parses to type-check the columns (``planner.JSONL_SAMPLE_LINES``)."""
COSINE_TOLERANCE = 0.999
"""Minimum cosine similarity between two runs' vectors for one id (batch composition changes rounding)."""
LONG_WORDS = 3000

R = DeadLetterReason


# ------------------------------------------------------------------------------------------ raw values


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()
"""The key is absent from the JSONL record."""


@dataclass(frozen=True)
class Surrogate:
    """A string holding a lone UTF-16 surrogate: ``pre + "\\ud800" + post`` (JSONL: written as the
    6-character escape, which JSON allows)."""

    pre: str = ""
    post: str = ""

    def as_str(self) -> str:
        return self.pre + "\ud800" + self.post


@dataclass(frozen=True)
class BadBytes:
    """A string whose bytes hold invalid UTF-8 (``\\xff\\xfe`` between ``pre`` and ``post``)."""

    pre: str = ""
    post: str = ""

    def as_bytes(self) -> bytes:
        return self.pre.encode() + b"\xff\xfe" + self.post.encode()


@dataclass(frozen=True)
class Long:
    """A text of ``words`` words (far past MiniLM's 256 tokens: the result is ``truncated``)."""

    words: int = LONG_WORDS

    def as_str(self) -> str:
        return " ".join(("lorem", "ipsum", "dolor", "sit", "amet")[i % 5] for i in range(self.words))


@dataclass(frozen=True)
class Row:
    """One generated input row.

    Attributes:
        id / text / section: raw values (``MISSING``, ``None``, ``int``, ``str``, other JSON values, or a
            :class:`Surrogate` / :class:`BadBytes` / :class:`Long` marker).
        line: for JSONL, raw bytes that replace the record (an unparsable or non-object line).
    """

    id: Any
    text: Any
    section: Any = MISSING
    line: bytes | None = None


@dataclass
class Dataset:
    """A generated input and how to run it.

    Attributes:
        fmt: ``parquet`` or ``jsonl``.
        files: rows per input file, in the planner's (sorted) file order.
        id_type: ``int`` or ``str`` (the Parquet column type / the JSONL ids of the sampled lines).
        text_binary: Parquet text column typed ``binary`` (invalid UTF-8 possible).
        rows_per_shard: for the split run (1..rows).
        chunk_rows / read_batch_rows: worker settings (small, so shards have several chunks).
        kills: global commit number -> ``before`` / ``after`` / ``term`` (see the module docstring).
        row_group_rows: Parquet row group size.
        ensure_ascii: JSONL lines written with ``\\uXXXX`` escapes for every non-ASCII character.
        blank_lines: JSONL blank lines inserted before row ``i`` (they are not rows).
        crlf: JSONL lines end with CRLF.
    """

    fmt: str
    files: list[list[Row]]
    id_type: str
    rows_per_shard: int
    chunk_rows: int
    read_batch_rows: int
    kills: dict[int, str] = field(default_factory=dict)
    text_binary: bool = False
    row_group_rows: int = 1000
    ensure_ascii: bool = False
    blank_lines: frozenset[int] = frozenset()
    crlf: bool = False

    @property
    def rows(self) -> int:
        return sum(len(f) for f in self.files)

    def worker(self) -> dict[str, Any]:
        return {"chunk_rows": self.chunk_rows, "read_batch_rows": self.read_batch_rows, "token_budget": 4096,
                "progress_interval_seconds": 60.0}

    def __repr__(self) -> str:  # hypothesis prints falsifying examples with repr: keep it readable
        files = ",\n    ".join(repr(f) for f in self.files)
        opts = {k: getattr(self, k) for k in ("id_type", "text_binary", "rows_per_shard", "chunk_rows",
                                              "read_batch_rows", "kills", "row_group_rows", "ensure_ascii",
                                              "crlf")}
        opts["blank_lines"] = sorted(self.blank_lines)
        return f"Dataset({self.fmt!r}, files=[\n    {files}], {opts})"


# ------------------------------------------------------------------------------------------ strategies

ODD_PIECES = [
    "e\u0301", "\u0301", "\u0363\u0364", "\U0001f44d\U0001f3fd", "\U0001f468\u200d\U0001f469\u200d\U0001f467",
    "\u0645\u0631\u062d\u0628\u0627", "\u05e9\u05dc\u05d5\u05dd", "\u202e", "\u200f", "\x01", "\x1b", "\x7f",
    "\x85", "\u200b", "\ufeff", "\u00a0", "\u3000", "\t", "\n", " ", "\ufffd", "\U0010ffff", "\\", '"', "/",
    "\u4e2d\u6587", "\u0130", "\u00df",
]
WHITESPACE = [" ", "\t", "\n", "\r", "\u00a0", "\u2003", "\u3000", "\x1c", "\x0b"]
WORDS = ["hello", "world", "library", "parser", "command", "line", "the", "of", "package", "data"]

_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
odd_text = st.one_of(
    st.lists(st.sampled_from(ODD_PIECES), min_size=1, max_size=6).map("".join),
    st.text(_chars, min_size=1, max_size=12),
)
normal_text = st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map(" ".join)
blank = st.lists(st.sampled_from(WHITESPACE), min_size=0, max_size=4).map("".join)
short_piece = st.one_of(st.sampled_from(WORDS), st.lists(st.sampled_from(ODD_PIECES), max_size=2).map("".join))

STR_ID_POOL = ["a", "b", "pkg/x", "\u00e9", "e\u0301", "\U0001f44d", " a", "a ", "\u05d0\u05d1", "x\ny", "\x1b[0m",
               "\u202eabc", "0", "1"]


def _broken(draw: st.DrawFn, jsonl: bool) -> Surrogate | BadBytes:
    kinds = [BadBytes] + ([Surrogate] if jsonl else [])
    return draw(st.sampled_from(kinds))(draw(short_piece), draw(short_piece))


@st.composite
def _id(draw: st.DrawFn, id_type: str, fmt: str, broken: bool, late: bool) -> Any:
    jsonl = fmt == "jsonl"
    choice = draw(st.sampled_from(["pool"] * 6 + ["fresh", "null", "blank"]
                                  + (["missing"] if jsonl else [])
                                  + (["broken"] * 2 if broken and jsonl and id_type == "str" else [])
                                  + (["other"] if late else [])))
    if choice == "null":
        return None
    if choice == "missing":
        return MISSING
    if choice == "broken":
        return _broken(draw, jsonl)
    if choice == "other":  # only after the planner's sampled lines: other types are per-row problems
        return draw(st.sampled_from([True, 1.5, ["a"], {"k": 1}, 7, "seven"]))
    if id_type == "int":
        if choice == "blank":
            return None
        if choice == "pool":
            return draw(st.integers(-2, 3))
        big = [2**63 - 1, -(2**63)] + ([2**64 + 1] if jsonl else [])
        return draw(st.one_of(st.integers(-(2**40), 2**40), st.sampled_from(big)))
    if choice == "blank":
        return draw(blank)
    if choice == "pool":
        return draw(st.sampled_from(STR_ID_POOL))
    return draw(odd_text)


@st.composite
def _text(draw: st.DrawFn, fmt: str, broken: bool, late: bool, text_binary: bool) -> Any:
    jsonl = fmt == "jsonl"
    choice = draw(st.sampled_from(["normal"] * 5 + ["odd"] * 2 + ["null", "empty", "blank", "long"]
                                  + (["missing"] if jsonl else [])
                                  + (["broken"] * 2 if broken and (jsonl or text_binary) else [])
                                  + (["other"] if late else [])))
    if choice == "normal":
        return draw(normal_text)
    if choice == "odd":
        return draw(odd_text)
    if choice == "null":
        return None
    if choice == "empty":
        return ""
    if choice == "blank":
        return draw(blank)
    if choice == "long":
        return Long()
    if choice == "missing":
        return MISSING
    if choice == "broken":
        return _broken(draw, jsonl)
    return draw(st.sampled_from([12345, ["a", "b"], True, {"t": "x"}, 1.5]))


@st.composite
def _section(draw: st.DrawFn, fmt: str, broken: bool, parquet_type: str) -> Any:
    if fmt == "parquet":
        if parquet_type == "int":
            return draw(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)))
        return draw(st.one_of(st.none(), odd_text, normal_text))
    options = [st.just(MISSING), st.none(), odd_text, normal_text, st.integers(-(2**70), 2**70),
               st.floats(allow_nan=False), st.booleans(), st.lists(st.integers(), max_size=3),
               st.dictionaries(st.sampled_from(["k", "\u00e9"]), st.integers(), max_size=2)]
    if broken:
        options.append(st.builds(Surrogate, short_piece, short_piece))
        options.append(st.builds(BadBytes, short_piece, short_piece))
    return draw(st.one_of(options))


UNPARSABLE_LINES = [b"{not json", b'{"id": "x", "text": ', b"[1, 2, 3]", b'"just a string"', b"null"]


@st.composite
def datasets(draw: st.DrawFn, broken: bool = False) -> Dataset:
    """A small generated input (see the module docstring); ``broken`` adds lone surrogates, invalid
    UTF-8 and (after a 200-line JSONL prefix, so the planner's sample passes) unparsable lines, ids and
    texts of other JSON types."""
    fmt = draw(st.sampled_from(["parquet", "jsonl"]))
    id_type = draw(st.sampled_from(["int", "str"]))
    text_binary = fmt == "parquet" and draw(st.booleans())
    late = broken and fmt == "jsonl" and draw(st.integers(0, 3)) == 0
    n_files = 1 if late else draw(st.integers(1, 3))
    section_type = draw(st.sampled_from(["str", "int", "none"]))
    files: list[list[Row]] = []
    for _ in range(n_files):
        n = draw(st.integers(0 if n_files > 1 else 1, 25 // n_files if not late else 8))
        rows = []
        for _ in range(n):
            if late and draw(st.integers(0, 5)) == 0:
                rows.append(Row(id=None, text=None, line=draw(st.sampled_from(UNPARSABLE_LINES))))
                continue
            section = MISSING if section_type == "none" else draw(_section(fmt, broken, section_type))
            rows.append(Row(id=draw(_id(id_type, fmt, broken, late)), text=draw(_text(fmt, broken, late, text_binary)),
                            section=section))
        files.append(rows)
    if late:  # pass the planner's sampled lines with cheap rows (empty text: dead letters, no inference)
        pad = [Row(id=(10**9 + i if id_type == "int" else f"~pad{i:03d}"), text="") for i in range(JSONL_SAMPLE_LINES)]
        files[0] = pad + files[0]
    total = sum(len(f) for f in files)
    if total == 0:
        files[0].append(Row(id=1 if id_type == "int" else "a", text="hello"))
        total = 1
    lo = math.ceil(total / 6) if late else 1
    return Dataset(
        fmt=fmt, files=files, id_type=id_type, text_binary=text_binary,
        rows_per_shard=draw(st.integers(lo, total)),
        chunk_rows=draw(st.integers(1, 5)),
        read_batch_rows=draw(st.integers(1, 8)),
        kills=draw(st.dictionaries(st.integers(0, 12), st.sampled_from(["before", "after", "term"]), max_size=3)),
        row_group_rows=draw(st.integers(1, 8)),
        ensure_ascii=draw(st.booleans()),
        blank_lines=frozenset(draw(st.lists(st.integers(0, 8), max_size=2))) if fmt == "jsonl" else frozenset(),
        crlf=fmt == "jsonl" and draw(st.booleans()),
    )


# ------------------------------------------------------------------------------------------ writing


def _json_value(v: Any, ensure_ascii: bool) -> bytes:
    if isinstance(v, Surrogate):
        return json.dumps(v.as_str(), ensure_ascii=True).encode()
    if isinstance(v, BadBytes):
        pre = json.dumps(v.pre, ensure_ascii=ensure_ascii)[1:-1].encode()
        post = json.dumps(v.post, ensure_ascii=ensure_ascii)[1:-1].encode()
        return b'"' + pre + b"\xff\xfe" + post + b'"'
    if isinstance(v, Long):
        v = v.as_str()
    return json.dumps(v, ensure_ascii=ensure_ascii).encode()


def jsonl_line(row: Row, ensure_ascii: bool) -> bytes:
    """The bytes of one JSONL line (no terminator)."""
    if row.line is not None:
        return row.line
    items = [(k, getattr(row, k)) for k in ("id", "text", "section")]
    body = b", ".join(json.dumps(k).encode() + b": " + _json_value(v, ensure_ascii) for k, v in items
                      if v is not MISSING)
    return b"{" + body + b"}"


def _parquet_text(v: Any, binary: bool) -> Any:
    if isinstance(v, Long):
        v = v.as_str()
    if isinstance(v, BadBytes):
        return v.as_bytes()
    if binary and isinstance(v, str):
        return v.encode()
    return v


def write_dataset(ds: Dataset, directory: Path) -> tuple[str, list[str]]:
    """Write the input files under ``directory/in``; returns ``(input_uri, file uris in planner order)``."""
    d = directory / "in"
    d.mkdir(parents=True)
    uris = []
    for k, rows in enumerate(ds.files):
        if ds.fmt == "jsonl":
            path = d / f"f{k}.jsonl"
            nl = b"\r\n" if ds.crlf else b"\n"
            out = []
            for i, row in enumerate(rows):
                if i in ds.blank_lines:
                    out.append(b" \t")
                out.append(jsonl_line(row, ds.ensure_ascii))
            path.write_bytes(nl.join(out) + (nl if rows else b""))
        else:
            path = d / f"f{k}.parquet"
            id_type = pa.int64() if ds.id_type == "int" else pa.string()
            cols: dict[str, pa.Array] = {
                "id": pa.array([r.id for r in rows], id_type),
                "text": pa.array([_parquet_text(r.text, ds.text_binary) for r in rows],
                                 pa.binary() if ds.text_binary else pa.string()),
            }
            sections = [r.section for r in rows]
            if rows and all(s is not MISSING for s in sections):
                is_int = any(isinstance(s, int) for s in sections)
                cols["section"] = pa.array(sections, pa.int64() if is_int else pa.string())
            pq.write_table(pa.table(cols), path, row_group_size=max(1, ds.row_group_rows))
        uris.append(str(path.resolve()))
    return str(d.resolve()), uris


# ------------------------------------------------------------------------------------------ oracle


def _jsonl_type(v: Any) -> str:
    if v is None or v is MISSING:
        return "null"
    if isinstance(v, bool):
        return "other:bool"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, str | Surrogate | BadBytes | Long):
        return "string"
    return "other"


def expected_plan_error(ds: Dataset) -> str | None:
    """Regex of the ``PlanError`` the planner must raise for an input invalid as a whole, else ``None``.

    JSONL only (Parquet columns are typed): in each non-empty file's first 200 lines, a line that is not
    a JSON object; an id or text column absent or null on every sampled line; mixed types.
    """
    if ds.fmt != "jsonl":
        return None
    classes = []
    for rows in ds.files:
        sample = rows[:JSONL_SAMPLE_LINES]
        if not sample:
            continue
        if any(r.line is not None for r in sample):
            return r"is not (valid JSON|a JSON object)"
        file_classes = {}
        for role in ("id", "text"):
            values = [getattr(r, role) for r in sample]
            types = {_jsonl_type(v) for v in values} - {"null"}
            if not types:
                return rf"{role}_column: column '{role}' is (missing from|all null in)"
            if len(types) > 1:
                return rf"{role}_column: column '{role}' mixes types"
            t = types.pop()
            if (role == "id" and t not in ("integer", "string")) or (role == "text" and t != "string"):
                return rf"{role}_column: column '{role}' has type"
            file_classes[role] = t
        classes.append(file_classes)
    for role in ("id", "text"):
        if len({c[role] for c in classes}) > 1:
            return rf"{role}_column: column '{role}' is .* but .* in"
    return None


@dataclass(frozen=True)
class Expected:
    """The spec's outcome of one input row: a result (``reason is None``) or a dead letter.

    ``id`` is the published id (``ANY_ID``: not specified, e.g. the dead letter of a blank id)."""

    reason: DeadLetterReason | None
    id: str | None
    truncated: bool = False
    text_repaired: bool = False


ANY_ID = "<any>"


def _own_problem(row: Row) -> tuple[DeadLetterReason | None, str | None, bool]:
    """``(reason, id, text_repaired)`` of a row judged on its own (no duplicate rule)."""
    if row.line is not None:
        return R.INVALID_RECORD, None, False
    rid = row.id
    if rid is None or rid is MISSING:
        return R.NULL_ID, None, False
    if isinstance(rid, Surrogate | BadBytes) or isinstance(rid, bool) or not isinstance(rid, int | str):
        return R.INVALID_ID, None, False
    if isinstance(rid, str) and not rid.strip():
        return R.INVALID_ID, ANY_ID, False
    sid = str(rid)
    text = row.text
    if text is None or text is MISSING:
        return R.NULL_TEXT, sid, False
    if isinstance(text, Surrogate | BadBytes):
        return None, sid, True  # repaired with U+FFFD: never blank
    if isinstance(text, Long):
        return None, sid, False
    if not isinstance(text, str):
        return R.NON_STRING_TEXT, sid, False
    if not text.strip():
        return R.EMPTY_TEXT, sid, False
    return None, sid, False


def expected_outcome(ds: Dataset, uris: list[str]) -> dict[tuple[str, int], Expected]:
    """The spec's outcome per ``(source_uri, source_row)``: for each id the first *valid* occurrence in
    input order (files in planner order, rows in file order) wins; every later valid occurrence is a
    ``duplicate_id`` dead letter; rows invalid on their own keep their own reason."""
    out: dict[tuple[str, int], Expected] = {}
    seen: set[str] = set()
    for uri, rows in zip(uris, ds.files, strict=True):
        for i, row in enumerate(rows):
            reason, rid, repaired = _own_problem(row)
            if reason is None:
                if rid in seen:
                    out[(uri, i)] = Expected(R.DUPLICATE_ID, rid)
                    continue
                seen.add(rid)
                out[(uri, i)] = Expected(None, rid, truncated=isinstance(row.text, Long), text_repaired=repaired)
            else:
                out[(uri, i)] = Expected(reason, rid)
    return out


# ------------------------------------------------------------------------------------------ the whole path


class SimulatedKill(BaseException):
    """Raised at a commit to simulate the worker process dying there (not an ``Exception``: nothing in
    the worker may swallow it)."""


@dataclass
class Published:
    """What a run left in the live tables (or, when publish refused an all-dead-letter run, in the shard
    files: ``refused`` holds the error and ``results`` is empty).

    Attributes:
        results: id -> ``(embedding float32[384], truncated, text_repaired)``.
        result_rows: result rows read (== ``len(results)`` when ids are unique).
        dead: ``(source_uri, source_row)`` -> ``(id, reason, detail)``.
        dead_rows: dead-letter rows read.
        summary: ``publish_run``'s summary (``None`` when refused).
        exit_codes: per shard, the exit code of every attempt (``"killed"`` for a simulated kill).
        n_shards: shards planned.
    """

    results: dict[str, tuple[np.ndarray, bool, bool]]
    result_rows: int
    dead: dict[tuple[str, int], tuple[str | None, str, str]]
    dead_rows: int
    summary: dict[str, Any] | None
    exit_codes: dict[str, list[Any]]
    n_shards: int
    refused: Exception | None = None


def plan_run(input_uri: str, out_root: Path, run_id: str, ds: Dataset, rows_per_shard: int):
    from batch_inference.planner import PlanRequest, plan

    return plan(PlanRequest(input_uri=input_uri, id_column="id", text_column="text", output_root=str(out_root),
                            run_id=run_id, engine=ENGINE, worker=ds.worker(), rows_per_shard=rows_per_shard))


def run_shard_with_kills(run_dir: str, shard_id: str, kills: dict[int, str], counter: list[int]) -> list[Any]:
    """Run one shard to completion in-process, killing it at the global commit numbers in ``kills``.

    ``counter[0]`` counts commit calls across shards and attempts. Returns every attempt's exit code
    (``"killed"`` for a simulated kill)."""
    from batch_worker import runtime

    real_commit = runtime.commit_table
    codes: list[Any] = []
    for _attempt in range(len(kills) + 3):
        with mock.patch.object(runtime, "engine_class", _warm_engine_class):
            ctx = runtime.load_context(run_dir, shard_id)
        if runtime.existing_marker(ctx) is not None:
            codes.append(int(ExitCode.OK))
            return codes
        shard_run = runtime.ShardRun(ctx)

        def commit(shard_dir: str, prefix: str, chunk: int, table: pa.Table, _run=shard_run) -> str:
            n = counter[0]
            counter[0] += 1
            mode = kills.get(n)
            if mode == "before":  # died while writing: a partial temp file, nothing committed
                tmp = storage.local_path(join_uri(shard_dir, f"{TEMP_MARK}{prefix}{chunk:06d}-killed"))
                tmp.write_bytes(b"PAR1 partial")
                raise SimulatedKill(f"commit {n} (before)")
            name = real_commit(shard_dir, prefix, chunk, table)
            if mode == "after":
                raise SimulatedKill(f"commit {n} (after)")
            if mode == "term":
                _run.stop._event.set()  # what the SIGTERM handler sets (without its hard-exit watchdog)
            return name

        with mock.patch.object(runtime, "commit_table", commit):
            try:
                code = shard_run.run(install_signals=False)
            except SimulatedKill:
                code = "killed"
            finally:
                shard_run.stop._event.set()  # let a killed attempt's producer thread exit
        codes.append(code)
        if code == int(ExitCode.OK):
            return codes
        assert code in ("killed", int(ExitCode.INTERRUPTED)), f"shard {shard_id}: attempt exited {code}"
    raise AssertionError(f"shard {shard_id}: not complete after {len(codes)} attempts: {codes}")


_ENGINES: dict[str, Any] = {}


def _warm_engine_class(kind: Any) -> Any:
    """``engine_class`` whose engines are reused per (config, worker settings), so MiniLM is loaded
    once per worker configuration instead of once per shard attempt (a warm worker process; every
    attempt still rebuilds its ledger from storage). ``PROPS_FRESH_ENGINE=1``: a fresh engine each time."""
    from batch_worker.engines.base import engine_class

    cls = engine_class(kind)
    if os.environ.get("PROPS_FRESH_ENGINE"):
        return cls

    def make(config: Any, settings: Any) -> Any:
        key = repr((config, settings))
        engine = _ENGINES.get(key)
        if engine is None:
            engine = _ENGINES[key] = cls(config, settings)
        return engine

    return make


def _read_live(db_path: Path, table: str) -> tuple[dict, int, dict, int]:
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        res_rows = con.execute(f'SELECT id, embedding, truncated, text_repaired FROM "batch_inference"."{table}"').fetchall()
        dl_rows = con.execute(
            f'SELECT id, reason, detail, source_uri, source_row FROM "batch_inference"."{table}__dead_letters"').fetchall()
    finally:
        con.close()
    results = {r[0]: (np.asarray(r[1], dtype=np.float32), bool(r[2]), bool(r[3])) for r in res_rows}
    dead = {(r[3], int(r[4])): (r[0], r[1], r[2]) for r in dl_rows}
    return results, len(res_rows), dead, len(dl_rows)


def _read_shard_dead_letters(run_dir: str, shard_ids: list[str]) -> tuple[dict, int]:
    layout = RunLayout.from_run_dir(run_dir)
    dead: dict[tuple[str, int], tuple[str | None, str, str]] = {}
    n = 0
    for sid in shard_ids:
        sdir = layout.shard_dir(sid)
        for name in storage.list_names(sdir):
            if chunk_of(name) is None or not name.startswith(DEAD_LETTER_PREFIX):
                continue
            for r in pq.read_table(join_uri(sdir, name)).to_pylist():
                dead[(r["source_uri"], r["source_row"])] = (r["id"], r["reason"], r["detail"])
                n += 1
    return dead, n


def run_whole_path(ds: Dataset, input_uri: str, work: Path, name: str, rows_per_shard: int,
                   kills: dict[int, str] | None = None) -> Published:
    """Plan (real planner), run every shard (real worker, in-process, with ``kills``), publish (real
    DuckDB publish into ``work/<name>.duckdb``, table ``<name>``).

    Raises:
        PlanError: the planner refused the input.
    """
    from batch_inference.publish.api import publish_run
    from batch_inference.publish.errors import CoverageError
    from batch_inference.publish.target import PublishTarget

    manifest, refs = plan_run(input_uri, work / "out", name, ds, rows_per_shard)
    counter = [0]
    codes = {r["shard_id"]: run_shard_with_kills(r["run_dir"], r["shard_id"], kills or {}, counter) for r in refs}
    run_dir = RunLayout(str(work / "out"), name).run_dir
    db = work / f"{name}.duckdb"
    try:
        summary = publish_run(run_dir, PublishTarget(backend="duckdb", table=name, duckdb_path=str(db)))
    except CoverageError as exc:
        if "none of its" not in str(exc):
            raise
        dead, n_dead = _read_shard_dead_letters(run_dir, [r["shard_id"] for r in refs])
        return Published({}, 0, dead, n_dead, None, codes, len(refs), refused=exc)
    results, n_res, dead, n_dead = _read_live(db, name)
    return Published(results, n_res, dead, n_dead, summary, codes, len(refs))


class Workdir:
    """A fresh directory per hypothesis example (function-scoped pytest fixtures are shared across
    examples), removed afterwards."""

    def __init__(self, base: Path) -> None:
        self.base = base

    def __enter__(self) -> Path:
        self.path = Path(tempfile.mkdtemp(prefix="ex-", dir=self.base))
        return self.path

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


# ------------------------------------------------------------------------------------------ comparisons


def min_cosine(a: dict[str, tuple], b: dict[str, tuple]) -> float:
    """Smallest cosine similarity between the two runs' vectors over ids in both (1.0 if none)."""
    common = sorted(set(a) & set(b))
    if not common:
        return 1.0
    x = np.stack([a[i][0] for i in common]).astype(np.float64)
    y = np.stack([b[i][0] for i in common]).astype(np.float64)
    cos = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
    return float(cos.min())


def flags(p: Published) -> dict[str, tuple[bool, bool]]:
    """id -> ``(truncated, text_repaired)``."""
    return {k: (v[1], v[2]) for k, v in p.results.items()}


def dead_keys(p: Published) -> dict[tuple[str, int], tuple[str | None, str]]:
    """position -> ``(id, reason)`` (no detail)."""
    return {k: v[:2] for k, v in p.dead.items()}


def reasons(p: Published) -> Counter:
    return Counter(v[1] for v in p.dead.values())
