"""OpenAI batch JSONL in: one request line -> one input row, or a rejected line with a reason.

Stdlib only (part of the contract: the Airflow side converts an uploaded file, the tests and docs read
the same rules). A line of an OpenAI batch input file is ``{"custom_id", "method", "url", "body"}``
(https://platform.openai.com/docs/guides/batch). :func:`parse_line` checks one line the way OpenAI's
own validation does (the limits below are OpenAI's published ones where OpenAI publishes one, ours
otherwise; ``docs/openai-batch.md`` lists them) and maps it onto this project's row:

* ``custom_id`` -> the row id (a non-empty string, at most :data:`MAX_CUSTOM_ID_CHARS` characters,
  unique in the file: the second and later lines with one id are rejected ``duplicate_custom_id``);
* ``body.messages`` (chat), ``body.prompt`` (completions) or ``body.input`` (embeddings) -> the row's
  ``text`` (for chat: the messages as canonical JSON, which the LLM engine's chat template renders);
* ``body`` sampling fields -> the row's :class:`Sampling` (``max_tokens`` or ``max_completion_tokens``,
  ``temperature``, ``top_p``, ``seed``, ``stop``, ``response_format`` of type ``json_schema``).

Rejected, as a :class:`Rejection` with a code and a message (the caller writes it to the batch's
error file; it never fails a shard): a line that is not JSON or not an object, a missing or
duplicate ``custom_id``, a ``method`` other than ``POST``, a ``url`` other than the batch's
endpoint or one the engine cannot serve, a ``body.model`` other than the batch's model, a body field
the engine does not support (``n`` > 1, ``tools``, ``logprobs``, ``stream``...), or a field of the
wrong type or out of OpenAI's range.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from batch_contract.enums import DeadLetterReason

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
ENDPOINTS = (CHAT, COMPLETIONS, EMBEDDINGS)
"""The ``url`` / ``endpoint`` values served (OpenAI's batch endpoints that an engine here can run)."""
ENGINE_OF_ENDPOINT = {CHAT: "llm", COMPLETIONS: "llm", EMBEDDINGS: "encoder"}
"""Which engine kind serves an endpoint (``batch_contract.enums.EngineKind`` values)."""
SAMPLING_COLUMN = "sampling"
"""The input column of a request's own sampling settings (:meth:`Request.row`)."""
ENGINE_OPTIONS_OF_ENDPOINT: dict[str, dict[str, Any]] = {
    CHAT: {"row_messages": True, "row_sampling_column": SAMPLING_COLUMN},
    COMPLETIONS: {"use_chat_template": False, "row_sampling_column": SAMPLING_COLUMN},
    EMBEDDINGS: {},
}
"""LLM engine options a batch of an endpoint runs with (``batch_contract.llm_config.LLMConfig``): a chat
request's messages are the row's whole conversation; a completion's prompt is used as is (no chat
template); each row's sampling settings come from :data:`SAMPLING_COLUMN`."""

MAX_REQUESTS = 50_000
"""Most request lines in one input file (OpenAI's limit per batch)."""
MAX_FILE_BYTES = 200 * 1024 * 1024
"""Largest input file, bytes (OpenAI's limit for a batch input file: 200 MB)."""
MAX_CUSTOM_ID_CHARS = 512
"""Longest ``custom_id``, characters (ours; OpenAI publishes none)."""
MAX_STOP_SEQUENCES = 4
"""Most ``stop`` strings (OpenAI's chat/completions limit)."""
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
"""A batch's ``metadata``: at most 16 pairs, keys up to 64 and values up to 512 characters (OpenAI's)."""

CHAT_ROLES = frozenset({"system", "developer", "user", "assistant"})
"""Message roles accepted (``tool`` / ``function`` messages need tools, which are not supported)."""
SAMPLING_KEYS = frozenset({"max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
                           "response_format"})
IGNORED_KEYS = frozenset({"model", "messages", "prompt", "input", "user", "store", "metadata",
                          "encoding_format", "service_tier"})
"""Body keys read elsewhere (``model``, the input) or without effect on an offline run (``user``,
``store``, ``metadata``, ``service_tier``; ``encoding_format`` is checked: only ``float``)."""
DEFAULT_KEYS = {"n": 1, "stream": False, "logprobs": False, "presence_penalty": 0, "frequency_penalty": 0,
                "parallel_tool_calls": None, "tool_choice": "none", "echo": False, "best_of": 1}
"""Body keys accepted only at their default value (another value is rejected ``unsupported_parameter``)."""


class Code:
    """Rejection codes (the ``error.code`` of an error-file line, and the dead-letter reason of a refused
    line in a batch DAG run: :class:`batch_contract.enums.DeadLetterReason` holds the same values)."""

    INVALID_JSON = DeadLetterReason.OPENAI_INVALID_JSON.value
    MISSING_CUSTOM_ID = DeadLetterReason.OPENAI_MISSING_CUSTOM_ID.value
    DUPLICATE_CUSTOM_ID = DeadLetterReason.OPENAI_DUPLICATE_CUSTOM_ID.value
    INVALID_METHOD = DeadLetterReason.OPENAI_INVALID_METHOD.value
    INVALID_URL = DeadLetterReason.OPENAI_INVALID_URL.value
    MISMATCHED_ENDPOINT = DeadLetterReason.OPENAI_MISMATCHED_ENDPOINT.value
    MISMATCHED_MODEL = DeadLetterReason.OPENAI_MISMATCHED_MODEL.value
    INVALID_BODY = DeadLetterReason.OPENAI_INVALID_REQUEST.value
    UNSUPPORTED = DeadLetterReason.OPENAI_UNSUPPORTED.value


@dataclass(frozen=True)
class Sampling:
    """A request's sampling settings (``None``: the engine's own setting applies).

    Attributes:
        max_tokens: generated tokens, at most (``max_tokens`` or ``max_completion_tokens``), >= 1.
        temperature: 0..2 (0 is greedy).
        top_p: (0, 1].
        seed: integer seed for sampling with temperature > 0.
        stop: up to :data:`MAX_STOP_SEQUENCES` non-empty strings.
        json_schema: ``response_format.json_schema.schema`` (a JSON Schema object).
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    json_schema: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The settings given (``None`` ones left out), ``stop`` as a list: JSON-able."""
        out = {k: getattr(self, k) for k in ("max_tokens", "temperature", "top_p", "seed", "json_schema")
               if getattr(self, k) is not None}
        if self.stop is not None:
            out["stop"] = list(self.stop)
        return out


@dataclass(frozen=True)
class Request:
    """One accepted request line.

    Attributes:
        line: 0-based number of the line among the file's non-blank lines.
        custom_id: the row id.
        url: its endpoint (one of :data:`ENDPOINTS`).
        model: ``body.model``.
        text: the row's text: the prompt (completions), the input string (embeddings), or the chat
            messages as canonical JSON (``[{"role", "content"}, ...]``, keys sorted, no spaces).
        sampling: the request's sampling settings.
    """

    line: int
    custom_id: str
    url: str
    model: str
    text: str
    sampling: Sampling = field(default_factory=Sampling)

    def row(self) -> dict[str, Any]:
        """The input row: ``{"id", "text", "sampling"}``; ``sampling`` is the request's settings as JSON
        text (``""`` when it gives none), the LLM engine's ``row_sampling_column``."""
        given = self.sampling.to_dict()
        text = json.dumps(given, ensure_ascii=False, sort_keys=True, separators=(",", ":")) if given else ""
        return {"id": self.custom_id, "text": self.text, "sampling": text}


@dataclass(frozen=True)
class Rejection:
    """A line that is not run: ``custom_id`` (``None`` when the line has no readable one), a
    :class:`Code` and a message saying what to fix."""

    line: int
    custom_id: str | None
    code: str
    message: str


class LineError(ValueError):
    """Raised inside :func:`parse_line` for a rejected line (``code`` is a :class:`Code`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (isinstance(v, int | float) and not isinstance(v, bool)) and math.isfinite(v)


def _need(ok: bool, code: str, message: str) -> None:
    if not ok:
        raise LineError(code, message)


def _chat_text(messages: Any) -> str:
    _need(isinstance(messages, list) and bool(messages), Code.INVALID_BODY,
          "body.messages must be a non-empty array of messages")
    clean = []
    for i, m in enumerate(messages):
        _need(isinstance(m, dict), Code.INVALID_BODY, f"body.messages[{i}] must be an object")
        role, content = m.get("role"), m.get("content")
        _need(role in CHAT_ROLES, Code.UNSUPPORTED if isinstance(role, str) else Code.INVALID_BODY,
              f"body.messages[{i}].role {role!r} is not one of {sorted(CHAT_ROLES)}")
        extra = sorted(set(m) - {"role", "content", "name"})
        _need(not extra, Code.UNSUPPORTED, f"body.messages[{i}] has unsupported field(s) {extra}")
        _need(isinstance(content, str), Code.UNSUPPORTED if isinstance(content, list) else Code.INVALID_BODY,
              f"body.messages[{i}].content must be a string (content parts are not supported)")
        clean.append({"role": "system" if role == "developer" else role, "content": content})
    return json.dumps(clean, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _single_string(value: Any, name: str) -> str:
    """A string, or a list holding exactly one string (one row per request)."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    _need(isinstance(value, str), Code.UNSUPPORTED if isinstance(value, list) else Code.INVALID_BODY,
          f"body.{name} must be a string or a one-string array (arrays of several inputs or of token ids "
          "are not supported: send one request per input)")
    _need(bool(value.strip()), Code.INVALID_BODY, f"body.{name} is empty")
    return value


def _stop(value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    _need(isinstance(stops, list) and all(isinstance(s, str) and s for s in stops), Code.INVALID_BODY,
          "body.stop must be a non-empty string or an array of them")
    _need(len(stops) <= MAX_STOP_SEQUENCES, Code.INVALID_BODY,
          f"body.stop has {len(stops)} sequences; at most {MAX_STOP_SEQUENCES}")
    return tuple(stops)


def _schema(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    _need(isinstance(value, dict), Code.INVALID_BODY, "body.response_format must be an object")
    kind = value.get("type")
    if kind == "text":
        return None
    _need(kind == "json_schema", Code.UNSUPPORTED,
          f"body.response_format.type {kind!r}: only 'text' and 'json_schema' are supported")
    spec = value.get("json_schema")
    _need(isinstance(spec, dict) and isinstance(spec.get("schema"), dict) and bool(spec["schema"]),
          Code.INVALID_BODY, "body.response_format.json_schema.schema must be a non-empty JSON Schema object")
    return spec["schema"]


def _sampling(body: Mapping[str, Any]) -> Sampling:
    mt, mct = body.get("max_tokens"), body.get("max_completion_tokens")
    _need(mt is None or mct is None or mt == mct, Code.INVALID_BODY,
          "body.max_tokens and body.max_completion_tokens differ: give one")
    max_tokens = mt if mt is not None else mct
    _need(max_tokens is None or (_is_int(max_tokens) and max_tokens >= 1), Code.INVALID_BODY,
          f"body.max_tokens {max_tokens!r} is not an integer >= 1")
    temp, top_p, seed = body.get("temperature"), body.get("top_p"), body.get("seed")
    _need(temp is None or (_is_num(temp) and 0 <= temp <= 2), Code.INVALID_BODY,
          f"body.temperature {temp!r} is not a number in 0..2")
    _need(top_p is None or (_is_num(top_p) and 0 < top_p <= 1), Code.INVALID_BODY,
          f"body.top_p {top_p!r} is not a number in (0, 1]")
    _need(seed is None or _is_int(seed), Code.INVALID_BODY, f"body.seed {seed!r} is not an integer")
    return Sampling(max_tokens=max_tokens, temperature=None if temp is None else float(temp),
                    top_p=None if top_p is None else float(top_p), seed=seed, stop=_stop(body.get("stop")),
                    json_schema=_schema(body.get("response_format")))


def _check_keys(body: Mapping[str, Any], url: str) -> None:
    for key, value in body.items():
        if key in IGNORED_KEYS or (key in SAMPLING_KEYS and url != EMBEDDINGS):
            continue
        if key in DEFAULT_KEYS and value in (DEFAULT_KEYS[key], None):
            continue
        raise LineError(Code.UNSUPPORTED, f"body.{key} is not supported for {url}"
                        + (f" (only {DEFAULT_KEYS[key]!r})" if key in DEFAULT_KEYS else ""))
    fmt = body.get("encoding_format")
    _need(fmt in (None, "float"), Code.UNSUPPORTED, f"body.encoding_format {fmt!r}: only 'float' is supported")


def _text(body: Mapping[str, Any], url: str) -> str:
    if url == CHAT:
        return _chat_text(body.get("messages"))
    return _single_string(body.get("prompt" if url == COMPLETIONS else "input"),
                          "prompt" if url == COMPLETIONS else "input")


def _request(line: int, rec: dict[str, Any], endpoint: str, model: str | None) -> Request:
    cid = rec.get("custom_id")
    _need(isinstance(cid, str) and bool(cid), Code.MISSING_CUSTOM_ID, "custom_id must be a non-empty string")
    _need(len(cid) <= MAX_CUSTOM_ID_CHARS, Code.INVALID_BODY,
          f"custom_id is {len(cid)} characters; at most {MAX_CUSTOM_ID_CHARS}")
    _need(rec.get("method") == "POST", Code.INVALID_METHOD, f"method {rec.get('method')!r}: only 'POST'")
    url = rec.get("url")
    _need(url in ENDPOINTS, Code.INVALID_URL, f"url {url!r} is not one of {list(ENDPOINTS)}")
    _need(url == endpoint, Code.MISMATCHED_ENDPOINT, f"url {url!r} is not the batch's endpoint {endpoint!r}")
    body = rec.get("body")
    _need(isinstance(body, dict), Code.INVALID_BODY, "body must be an object")
    name = body.get("model")
    _need(isinstance(name, str) and bool(name), Code.INVALID_BODY, "body.model must be a non-empty string")
    _need(model is None or name == model, Code.MISMATCHED_MODEL,
          f"body.model {name!r} is not the batch's model {model!r}")
    _check_keys(body, url)
    sampling = _sampling(body) if url != EMBEDDINGS else Sampling()
    return Request(line=line, custom_id=cid, url=url, model=name, text=_text(body, url), sampling=sampling)


def decode(raw: bytes | str) -> tuple[dict[str, Any] | None, str | None]:
    """``(record, None)`` for a line holding a JSON object, else ``(None, why)``."""
    try:
        rec = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, deep nesting
        return None, f"line is not valid JSON ({type(exc).__name__}: {str(exc)[:120]})"
    if not isinstance(rec, dict):
        return None, f"line is JSON {type(rec).__name__}, not an object"
    return rec, None


def parse_line(line: int, raw: bytes | str, endpoint: str, model: str | None,
               seen: set[str] | None = None) -> Request | Rejection:
    """Check and map one input line.

    Args:
        line: the line's 0-based number among the file's non-blank lines.
        raw: the line (bytes as read, UTF-8; or text), without its newline.
        endpoint: the batch's endpoint (one of :data:`ENDPOINTS`).
        model: the batch's model (``body.model`` must equal it); ``None``: any.
        seen: custom ids of the earlier lines; the line's id is added when accepted or rejected for a
            reason other than a duplicate (so every later line with that id is the duplicate).

    Returns:
        A :class:`Request`, or a :class:`Rejection` naming the code and the fix. Never raises for bad
        input.
    """
    rec, why = decode(raw)
    if rec is None:
        return Rejection(line, None, Code.INVALID_JSON, why or "unreadable line")
    cid = rec.get("custom_id") if isinstance(rec.get("custom_id"), str) and rec.get("custom_id") else None
    if seen is not None and cid is not None:
        if cid in seen:
            return Rejection(line, cid, Code.DUPLICATE_CUSTOM_ID,
                             f"custom_id {cid!r} is used by an earlier line: custom ids must be unique")
        seen.add(cid)
    try:
        return _request(line, rec, endpoint, model)
    except LineError as exc:
        return Rejection(line, cid, exc.code, str(exc))


def iter_lines(data: bytes) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` of every non-blank line of ``data`` (``\\r\\n`` tolerated), numbered from 0
    like :func:`batch_contract.rows.iter_jsonl_lines`."""
    n = 0
    for raw in data.split(b"\n"):
        if raw.strip():
            yield n, raw.rstrip(b"\r")
            n += 1


def file_models(data: bytes) -> set[str]:
    """The distinct ``body.model`` strings the readable lines of a file name (to choose the batch's
    model: a file naming more than one is refused, as OpenAI does)."""
    models: set[str] = set()
    for _n, raw in iter_lines(data):
        rec, _ = decode(raw)
        body = rec.get("body") if rec else None
        if isinstance(body, dict) and isinstance(body.get("model"), str) and body["model"]:
            models.add(body["model"])
    return models


@dataclass
class Parsed:
    """A whole file checked: the accepted requests (file order) and the rejections (file order)."""

    requests: list[Request] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)

    @property
    def total(self) -> int:
        """Lines in the file (requests + rejections): every line ends in exactly one of the two."""
        return len(self.requests) + len(self.rejections)


def parse_file(lines: Iterable[tuple[int, bytes]], endpoint: str, model: str | None) -> Parsed:
    """:func:`parse_line` over every line, custom ids checked for uniqueness across the file."""
    out, seen = Parsed(), set()
    for n, raw in lines:
        got = parse_line(n, raw, endpoint, model, seen)
        (out.requests if isinstance(got, Request) else out.rejections).append(got)
    return out


def check_metadata(metadata: Any) -> dict[str, str]:
    """A batch's ``metadata`` checked against OpenAI's limits (``None``: ``{}``).

    Raises:
        ValueError: not an object of strings, more than 16 pairs, a key over 64 or a value over 512
            characters (the message names which).
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise ValueError("metadata must be an object of string keys and string values")
    if len(metadata) > MAX_METADATA_PAIRS:
        raise ValueError(f"metadata has {len(metadata)} pairs; at most {MAX_METADATA_PAIRS}")
    for k, v in metadata.items():
        if len(k) > MAX_METADATA_KEY_CHARS:
            raise ValueError(f"metadata key {k[:20]!r}... is over {MAX_METADATA_KEY_CHARS} characters")
        if len(v) > MAX_METADATA_VALUE_CHARS:
            raise ValueError(f"metadata value of {k!r} is over {MAX_METADATA_VALUE_CHARS} characters")
    return dict(metadata)


COMPLETION_WINDOW_HOURS = {"24h": 24.0}
"""``completion_window`` values and their hours (OpenAI accepts only ``24h``)."""


# ------------------------------------------------------------------ a batch DAG run's input (``input_format``)

INPUT_FORMAT_TABLE = "table"
INPUT_FORMAT_OPENAI = "openai_batch"
INPUT_FORMATS = (INPUT_FORMAT_TABLE, INPUT_FORMAT_OPENAI)
"""``input_format`` Param values: ``table`` (Parquet/JSONL rows with id and text columns) or
``openai_batch`` (JSONL of OpenAI batch request lines, converted by :func:`convert_file` at plan time)."""
REJECTION_KEY = "openai_rejection"
"""Key of a converted input row refused before the run: ``{"code", "message"}``; the worker dead-letters
the row with ``code`` as its reason and ``message`` as its detail (``input.rejection_key``)."""
LINE_KEY = "line"
"""Key of a converted row's 0-based line number in the OpenAI file (equal to its row number in the
converted file, which keeps every line in order)."""


def _most_named(values: Iterable[str]) -> str | None:
    """The value named most often, the first named on a tie; ``None`` for none."""
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return max(counts, key=lambda v: counts[v]) if counts else None  # dicts keep first-seen order


def _served_urls(data: bytes) -> Iterator[str]:
    for _n, raw in iter_lines(data):
        rec, _ = decode(raw)
        if rec is not None and rec.get("url") in ENDPOINTS:
            yield rec["url"]


def batch_endpoint(data: bytes, engine: str) -> str:
    """The endpoint of a batch DAG run over an OpenAI batch file: the served ``url`` most lines name (the
    first named on a tie); lines naming another are ``mismatched_endpoint`` (a batch has one endpoint,
    as in OpenAI's API). A file naming none gets the engine's own (``/v1/embeddings`` for the encoder,
    ``/v1/chat/completions`` for the LLM): every line is refused anyway.

    Raises:
        ValueError: that endpoint needs another engine than ``engine`` (``encoder`` / ``llm``); the
            message names the engine the lines need.
    """
    url = _most_named(_served_urls(data))
    if url is None:
        return EMBEDDINGS if engine == "encoder" else CHAT
    if ENGINE_OF_ENDPOINT[url] != engine:
        raise ValueError(f"the input's request lines are for {url}, which the {ENGINE_OF_ENDPOINT[url]} engine "
                         f"serves; this run's engine is {engine!r}: set engine={ENGINE_OF_ENDPOINT[url]!r} (and "
                         "its model), or send the lines to a run of that engine")
    return url


@dataclass
class Converted:
    """An OpenAI batch file converted into a run's input: one row per non-blank line, in file order.

    Attributes:
        endpoint: the batch's endpoint (:func:`batch_endpoint`).
        model: the batch's model name (the ``body.model`` most lines name; ``None`` when no line names one).
        rows: accepted lines as :meth:`Request.row` plus ``line``; refused ones as ``{"id": custom_id or
            None, "text": "", "sampling": "", "line", REJECTION_KEY: {"code", "message"}}``.
        accepted / rejected: counts (lines), ``accepted + rejected == len(rows)``.
    """

    endpoint: str
    model: str | None
    rows: list[dict[str, Any]]
    accepted: int
    rejected: int


def rejected_row(r: Rejection) -> dict[str, Any]:
    """The converted input row of a refused line (:data:`REJECTION_KEY`)."""
    return {"id": r.custom_id, "text": "", SAMPLING_COLUMN: "", LINE_KEY: r.line,
            REJECTION_KEY: {"code": r.code, "message": r.message}}


def convert_file(data: bytes, engine: str) -> Converted:
    """Check every line of an OpenAI batch input file (:func:`parse_file`) against the batch's endpoint
    (:func:`batch_endpoint`) and model (the ``body.model`` most lines name, the first on a tie: OpenAI
    refuses a file whose requests name several models; here the others are ``model_mismatch`` lines)
    and convert it into the run's rows, accepted and refused alike, in file order.

    Args:
        data: the file's bytes (UTF-8 JSONL; blank lines skipped, as :func:`iter_lines`).
        engine: the run's engine kind (``encoder`` / ``llm``).

    Raises:
        ValueError: the lines need another engine (:func:`batch_endpoint`).
    """
    endpoint = batch_endpoint(data, engine)
    model = _most_named(models_in_order(data))
    parsed = parse_file(iter_lines(data), endpoint, model)
    rows = [{**r.row(), LINE_KEY: r.line} for r in parsed.requests]
    rows += [rejected_row(r) for r in parsed.rejections]
    rows.sort(key=lambda row: row[LINE_KEY])
    return Converted(endpoint=endpoint, model=model, rows=rows, accepted=len(parsed.requests),
                     rejected=len(parsed.rejections))


def models_in_order(data: bytes) -> Iterator[str]:
    """``body.model`` of every readable line that names one, in file order (with repeats)."""
    for _n, raw in iter_lines(data):
        rec, _ = decode(raw)
        body = rec.get("body") if rec else None
        if isinstance(body, dict) and isinstance(body.get("model"), str) and body["model"]:
            yield body["model"]
