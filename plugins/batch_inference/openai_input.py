"""A batch DAG run over an OpenAI batch input file (``input_format: openai_batch``): the plan's conversion.

The planner calls :func:`prepare` before it reads the input: the one JSONL file ``input_uri`` names is
checked line by line with the contract's rules (:func:`batch_contract.openai_batch.convert_file`, the
same the ``/v1/batches`` API applies) and committed, create-only, into the run directory:

* ``<run_dir>/openai/input.jsonl``: one row per non-blank line of the file, in file order (an accepted
  request as ``{"id": custom_id, "text", "sampling", "line"}``; a refused one with its ``{"code",
  "message"}`` under ``openai_rejection``, which the worker dead-letters with that code);
* ``<run_dir>/openai/request.json``: ``{"source_uri", "endpoint", "model", "lines", "accepted",
  "rejected"}``, what the run's output files (:mod:`batch_inference.openai_files`) need.

A rerun of the plan reads both back (the conversion of a run never changes). The run then reads the
converted file; the engine options of the endpoint (the rows' own conversation and sampling) are added
to the run's engine config.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from batch_contract import storage
from batch_contract.engine_config import ConfigError
from batch_contract.enums import InputFormat
from batch_contract.layout import join_uri
from batch_contract.openai_batch import (
    ENGINE_OPTIONS_OF_ENDPOINT,
    MAX_FILE_BYTES,
    MAX_REQUESTS,
    REJECTION_KEY,
    convert_file,
)
from batch_contract.openai_output import jsonl

log = logging.getLogger(__name__)

RUN_FOLDER = "openai"
"""Folder of a run directory holding an OpenAI batch run's converted input, its request record and its
output and error files (the API's batches use the same folder for their output files)."""
INPUT_NAME = "input.jsonl"
REQUEST_NAME = "request.json"
ID_COLUMN = "id"
TEXT_COLUMN = "text"


@dataclass(frozen=True)
class Prepared:
    """The run's view of a converted OpenAI batch input.

    Attributes:
        input_uri: the converted JSONL file the run reads (columns :data:`ID_COLUMN`, :data:`TEXT_COLUMN`).
        engine: the run's engine config dict with the endpoint's options
            (:data:`batch_contract.openai_batch.ENGINE_OPTIONS_OF_ENDPOINT`).
        request: the ``request.json`` record (module docstring).
        rejection_key: the manifest's ``input.rejection_key``.
    """

    input_uri: str
    engine: dict[str, Any]
    request: dict[str, Any]
    rejection_key: str = REJECTION_KEY


def folder(run_dir: str) -> str:
    """``<run_dir>/openai``: the run's OpenAI folder (a URI or local path, like ``run_dir``)."""
    return join_uri(run_dir, RUN_FOLDER)


def read_request(run_dir: str) -> dict[str, Any] | None:
    """The run's ``request.json`` record, or ``None`` when the run's input was not an OpenAI batch file."""
    return read_request_at(folder(run_dir))


Resolver = Callable[[str, list[str]], tuple[InputFormat, list[str]]]
"""``(input_uri, roots) -> (format, file URIs)``: the planner's ``resolve_input_files``, passed in (the
planner imports this module, so this module does not import the planner)."""


def _source(input_uri: str, roots: list[str], resolve: Resolver) -> bytes:
    """The bytes of the one JSONL file ``input_uri`` names (under ``roots``).

    Raises:
        ConfigError: not one JSONL file, or above OpenAI's file size limit.
    """
    fmt, uris = resolve(input_uri, roots)
    if fmt != InputFormat.JSONL or len(uris) != 1:
        raise ConfigError(f"input_uri: input_format=openai_batch reads one JSONL file of OpenAI batch requests; "
                        f"{input_uri} is {len(uris)} {fmt.value} file(s)")
    with storage.open_input_file(uris[0], roots) as fh:
        data = fh.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"input_uri: {uris[0]} is over {MAX_FILE_BYTES:,} bytes, OpenAI's limit for a batch "
                        "input file: split it")
    return data


def prepare(input_uri: str, run_dir: str, engine: dict[str, Any], roots: list[str], resolve: Resolver) -> Prepared:
    """Convert the run's OpenAI batch file into its input (module docstring), once per run.

    Args:
        input_uri: the ``input_uri`` Param: one JSONL file of OpenAI batch request lines.
        run_dir: the run directory.
        engine: the run's engine config dict (``kind`` is ``encoder`` or ``llm``).
        roots: allowed input roots (empty: no check).
        resolve: the planner's ``resolve_input_files`` (:data:`Resolver`).

    Raises:
        ConfigError: not one JSONL file, no request line, over 200 MB or 50,000 lines (OpenAI's limits), or
            lines for an endpoint the run's engine does not serve (the message names the engine to use).
    """
    base = folder(run_dir)
    request = read_request(run_dir)
    if request is None:
        request = _convert(input_uri, base, str(engine.get("kind")), roots, resolve)
    options = ENGINE_OPTIONS_OF_ENDPOINT[request["endpoint"]] if engine.get("kind") == "llm" else {}
    return Prepared(input_uri=join_uri(base, INPUT_NAME), engine={**engine, **options}, request=request)


def _convert(input_uri: str, base: str, engine_kind: str, roots: list[str], resolve: Resolver) -> dict[str, Any]:
    try:
        converted = convert_file(_source(input_uri, roots, resolve), engine_kind)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"engine: {exc}") from None
    if not converted.rows:
        raise ConfigError(f"input_uri: {input_uri} has no request lines (only blank ones, or none); OpenAI "
                          "refuses an empty batch input file")
    if len(converted.rows) > MAX_REQUESTS:
        raise ConfigError(f"input_uri: {input_uri} has {len(converted.rows):,} request lines; OpenAI's limit for "
                          f"a batch is {MAX_REQUESTS:,}: split it")
    request = {"source_uri": input_uri, "endpoint": converted.endpoint, "model": converted.model,
               "lines": len(converted.rows), "accepted": converted.accepted, "rejected": converted.rejected}
    storage.makedirs(base)
    for name, data in ((INPUT_NAME, jsonl(converted.rows)),
                       (REQUEST_NAME, json.dumps(request, sort_keys=True).encode())):
        try:
            storage.write_create_only(join_uri(base, name), data)
        except storage.AlreadyExistsError:  # a concurrent planner committed first: same input, same bytes
            pass
    log.info("OpenAI batch input %s: %d line(s) for %s (model %r), %d accepted, %d refused -> %s",
             input_uri, len(converted.rows), converted.endpoint, converted.model, converted.accepted,
             converted.rejected, base)
    return read_request_at(base) or request


def read_request_at(base: str) -> dict[str, Any] | None:
    """The ``request.json`` under an OpenAI folder ``base``, or ``None``."""
    try:
        return json.loads(storage.read_bytes(join_uri(base, REQUEST_NAME)))
    except FileNotFoundError:
        return None
