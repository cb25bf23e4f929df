"""Status enums, worker exit codes and dead-letter reason codes.

Every enum is a ``str`` (or ``int``) Enum so that its values serialise to JSON and Parquet as plain
strings/ints and read back with ``Enum(value)``.
"""

from __future__ import annotations

from enum import Enum, IntEnum


class ShardStatus(str, Enum):
    """Lifecycle of one shard, as written in progress objects and markers."""

    PENDING = "pending"
    RUNNING = "running"
    INTERRUPTED = "interrupted"  # SIGTERM/SIGINT: finished chunks committed, retry me
    FAILED = "failed"
    COMPLETE = "complete"


class ExitCode(IntEnum):
    """Exit codes of ``batch-worker run``; the orchestrator maps them to retry / no-retry.

    The value 75 is ``EX_TEMPFAIL`` from BSD ``sysexits.h`` ("temporary failure, retry later").
    """

    OK = 0
    FAILURE = 1  # anything unexpected: retried by the orchestrator
    BAD_INPUT = 2  # config or input no retry can fix; the message names the field/column
    INTERRUPTED = 75  # SIGTERM/SIGINT after committing finished chunks: retry me


class DeadLetterReason(str, Enum):
    """Why a row went to the dead letters instead of the results."""

    NULL_ID = "null_id"
    INVALID_ID = "invalid_id"
    DUPLICATE_ID = "duplicate_id"
    NULL_TEXT = "null_text"
    EMPTY_TEXT = "empty_text"  # empty or whitespace-only
    NON_STRING_TEXT = "non_string_text"
    INVALID_UTF8 = "invalid_utf8"
    TOO_LONG = "too_long"
    EMPTY_PROMPT = "empty_prompt"
    TEMPLATE_ERROR = "template_error"
    INVALID_OUTPUT = "invalid_output"  # LLM output failed to parse / validate against its schema
    ENGINE_ERROR = "engine_error"
    INVALID_RECORD = "invalid_record"  # the input record itself is unreadable (e.g. a JSONL line that is not JSON)
    # documents (batch_contract.documents): the row's document could not be turned into text
    UNREADABLE_DOCUMENT = "unreadable_document"  # missing, too large, not the kind the extractor reads, corrupt
    ENCRYPTED_DOCUMENT = "encrypted_document"  # a PDF that needs a password
    PAGE_LIMIT_EXCEEDED = "page_limit_exceeded"  # more pages than input.documents.max_pages
    EMPTY_EXTRACTION = "empty_extraction"  # the extractor found no text (no text layer and no OCR result)
    # OpenAI batch input (batch_contract.openai_batch.Code): a request line refused as OpenAI's validation would
    OPENAI_INVALID_JSON = "invalid_json_line"
    OPENAI_MISSING_CUSTOM_ID = "missing_custom_id"
    OPENAI_DUPLICATE_CUSTOM_ID = "duplicate_custom_id"
    OPENAI_INVALID_METHOD = "invalid_method"
    OPENAI_INVALID_URL = "invalid_url"
    OPENAI_MISMATCHED_ENDPOINT = "mismatched_endpoint"
    OPENAI_MISMATCHED_MODEL = "model_mismatch"
    OPENAI_INVALID_REQUEST = "invalid_request"
    OPENAI_UNSUPPORTED = "unsupported_parameter"


class EngineKind(str, Enum):
    """Which worker engine a manifest asks for."""

    ENCODER = "encoder"
    LLM = "llm"


class InputFormat(str, Enum):
    """Input dataset formats the planner and worker read."""

    PARQUET = "parquet"
    JSONL = "jsonl"
