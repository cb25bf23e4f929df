"""Where the OpenAI-compatible API keeps files and batch records (local directory or ``gs://``).

Under the catalog's ``files_root``::

    files/<file_id>.json          the file's record (FileObject fields, owner, where its bytes are)
    files/<file_id>.jsonl         an uploaded file's bytes
    batches/<batch_id>/batch.json the batch's record (BatchRecord)
    batches/<batch_id>/input.jsonl    the accepted requests as this project's JSONL rows (the run's input)
    batches/<batch_id>/rejected.jsonl the lines refused before the run, as error-file lines

A batch's output and error files are written into its run directory
(``<run_dir>/openai/output.jsonl`` and ``errors.jsonl``) once the run ends, and get a record here
pointing at them. Ids: ``file-<24 hex>`` and ``batch_<24 hex>`` (random; a batch id is also the
run id of its DAG run).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass, field
from typing import Any

from batch_contract import storage
from batch_contract.layout import join_uri

FILE_ID_PREFIX = "file-"
BATCH_ID_PREFIX = "batch_"


def new_file_id() -> str:
    """A fresh ``file-<24 hex>`` id."""
    return FILE_ID_PREFIX + secrets.token_hex(12)


def new_batch_id() -> str:
    """A fresh ``batch_<24 hex>`` id (a safe run id: letters, digits, ``_``)."""
    return BATCH_ID_PREFIX + secrets.token_hex(12)


def valid_id(value: str, prefix: str) -> bool:
    """Whether ``value`` is ``prefix`` + 24 lower-case hex digits (anything else is never looked up)."""
    tail = value[len(prefix):] if isinstance(value, str) and value.startswith(prefix) else ""
    return len(tail) == 24 and all(c in "0123456789abcdef" for c in tail)


@dataclass
class FileRecord:
    """An OpenAI ``file`` object plus where its bytes are and who may read them.

    Attributes:
        id / filename / purpose / created_at (Unix seconds) / bytes: the FileObject fields.
        uri: where the bytes are stored.
        owner: the user who uploaded it (``None`` for a batch's output or error file).
        batch_id: the batch an output or error file belongs to (``None`` for an upload).
    """

    id: str
    filename: str
    purpose: str
    created_at: int
    bytes: int
    uri: str
    owner: str | None = None
    batch_id: str | None = None

    def to_openai(self) -> dict[str, Any]:
        """The FileObject the API answers with."""
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": "processed",
                "expires_at": None, "status_details": None}


@dataclass
class BatchRecord:
    """What the API itself records of a batch; the rest of its state comes from the run store.

    Attributes:
        id: ``batch_<hex>``, also the run id of its DAG run.
        endpoint / input_file_id / completion_window / metadata: as created.
        model: the model the input's lines name; dag_id: the catalog's DAG for it.
        owner: who created it. created_at / cancelling_at / cancelled_at / finalized_at: Unix seconds.
        total: request lines in the input; rejected: lines refused before the run.
        status: a status the record decides on its own (``failed``: no line was accepted; ``None``:
            the run decides).
        errors: OpenAI ``errors.data`` entries of a ``failed`` batch.
        output_file_id / error_file_id: set once the output files are written.
        final_status: the status the output files were written for.
        counts: request counts when finalized (``{"total", "completed", "failed"}``).
    """

    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    model: str
    dag_id: str
    owner: str | None
    created_at: int
    total: int
    rejected: int
    metadata: dict[str, str] = field(default_factory=dict)
    status: str | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    finalized_at: int | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    final_status: str | None = None
    counts: dict[str, int] | None = None


class ApiStore:
    """The records and bytes under ``files_root`` (module docstring)."""

    def __init__(self, files_root: str) -> None:
        self.root = files_root.rstrip("/")

    def file_meta_uri(self, file_id: str) -> str:
        return join_uri(self.root, "files", f"{file_id}.json")

    def file_data_uri(self, file_id: str) -> str:
        return join_uri(self.root, "files", f"{file_id}.jsonl")

    def batch_dir(self, batch_id: str) -> str:
        return join_uri(self.root, "batches", batch_id)

    def batch_uri(self, batch_id: str, name: str) -> str:
        """``batches/<batch_id>/<name>``."""
        return join_uri(self.batch_dir(batch_id), name)

    def put_file(self, record: FileRecord, data: bytes | None = None) -> None:
        """Store an upload's bytes (when given; create-only) and its record."""
        if data is not None:
            storage.write_create_only(record.uri, data)
        storage.write_replace(self.file_meta_uri(record.id), json.dumps(asdict(record)).encode())

    def get_file(self, file_id: str) -> FileRecord | None:
        """The file's record, ``None`` when there is none (or the id is not of the id form)."""
        if not valid_id(file_id, FILE_ID_PREFIX):
            return None
        raw = _read(self.file_meta_uri(file_id))
        return None if raw is None else FileRecord(**json.loads(raw))

    def put_batch(self, record: BatchRecord) -> None:
        """Write (replace) the batch's record."""
        storage.write_replace(self.batch_uri(record.id, "batch.json"), json.dumps(asdict(record)).encode())

    def get_batch(self, batch_id: str) -> BatchRecord | None:
        """The batch's record, ``None`` when there is none (or the id is not of the id form)."""
        if not valid_id(batch_id, BATCH_ID_PREFIX):
            return None
        raw = _read(self.batch_uri(batch_id, "batch.json"))
        return None if raw is None else BatchRecord(**json.loads(raw))

    def batch_ids(self) -> list[str]:
        """Every batch id with a record under ``batches/`` (sorted)."""
        try:
            paths = storage.list_glob(join_uri(self.root, "batches"), "*/batch.json")
        except (FileNotFoundError, storage.StorageError):
            return []
        ids = (p.split("/")[0] for p in paths)
        return sorted(i for i in ids if valid_id(i, BATCH_ID_PREFIX))


def _read(uri: str) -> bytes | None:
    try:
        return storage.read_bytes(uri)
    except FileNotFoundError:
        return None
