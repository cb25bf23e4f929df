"""A finished batch's output and error files, built from its run's committed part and dead-letter files.

Every request line of the input ends in exactly one of the two files:

* a committed result row (``id`` = ``custom_id``) -> an output line (:func:`batch_contract.openai_output.output_line`);
* a line refused before the run (``rejected.jsonl``) -> its error line as written then;
* a dead-letter row of the run -> an error line whose code is the dead-letter reason and whose message
  is its detail;
* an accepted request with neither (the batch was cancelled or expired before its shard ran it, or its
  shard failed) -> an error line ``batch_cancelled`` / ``batch_expired`` / ``batch_failed``.

Read from the committed part files (each id once, the first committed wins, as publish does), not
from the published table: a cancelled or expired run has no published table, and its committed rows
are kept. The whole file is built in memory: at most ``max_requests`` lines (50,000).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow.parquet as pq
from batch_contract import storage
from batch_contract.layout import PART_PREFIX, join_uri
from batch_contract.openai_output import error_line, jsonl, output_line
from batch_contract.runstore import RunStore

from batch_inference.openai_api.store import ApiStore, BatchRecord
from batch_inference.ui.deadletters import iter_dead_letters

UNFINISHED_CODES = {"cancelled": "batch_cancelled", "expired": "batch_expired"}
"""Error code of a request the run never reached, by the batch's final status (else ``batch_failed``)."""
PART_COLUMNS = ("id", "n_tokens", "embedding", "output_text", "output_json", "prompt_tokens", "output_tokens",
                "finish_reason")


@dataclass
class BuiltFiles:
    """The two files' bytes and the request counts (``completed`` + ``failed`` == ``total``)."""

    output: bytes
    errors: bytes
    completed: int
    failed: int

    @property
    def total(self) -> int:
        return self.completed + self.failed


def iter_results(store: RunStore) -> Iterator[dict[str, Any]]:
    """Committed result rows of the run (each id once; shard, then commit order), as dicts of the
    :data:`PART_COLUMNS` the part files have."""
    seen: set[str] = set()
    for spec in store.manifest.shards:
        names = sorted(n for n in store.committed_files(spec.shard_id) if n.startswith(PART_PREFIX))
        for name in names:
            uri = join_uri(store.layout.shard_dir(spec.shard_id), name)
            fs, path = storage.arrow_filesystem(uri)
            with fs.open_input_file(path) as fh:
                pf = pq.ParquetFile(fh)
                cols = [c for c in PART_COLUMNS if c in pf.schema_arrow.names]
                for row in pf.read(columns=cols).to_pylist():
                    if row["id"] not in seen:
                        seen.add(row["id"])
                        yield row


def accepted_requests(api: ApiStore, batch_id: str) -> list[tuple[str, int]]:
    """``(custom_id, line)`` of the batch's accepted requests (its run's input), in file order."""
    try:
        data = storage.read_bytes(api.batch_uri(batch_id, "input.jsonl"))
    except FileNotFoundError:
        return []
    rows = [json.loads(line) for line in data.splitlines() if line.strip()]
    return [(r["id"], r["line"]) for r in rows]


def build_files(api: ApiStore, batch: BatchRecord, store: RunStore | None, final_status: str,
                created: int) -> BuiltFiles:
    """Build the output and error files of a batch whose run ended (or that never ran).

    Args:
        api: the API's store (the batch's ``input.jsonl`` and ``rejected.jsonl``).
        batch: the batch's record.
        store: its run's store (``None``: no run; every accepted request is unfinished).
        final_status: ``completed``, ``cancelled``, ``expired`` or ``failed``.
        created: Unix seconds for the response bodies' ``created``.

    Raises:
        OSError / StorageError: a committed file or the batch's own objects cannot be read.
    """
    requests = accepted_requests(api, batch.id)
    line_of = dict(requests)
    outputs, errors = [], []
    try:
        errors = [json.loads(x) for x in storage.read_bytes(api.batch_uri(batch.id, "rejected.jsonl")).splitlines()
                  if x.strip()]
    except FileNotFoundError:
        pass
    done: set[str] = set()
    if store is not None:
        for row in iter_results(store):
            if row["id"] in line_of and row["id"] not in done:
                done.add(row["id"])
                outputs.append(output_line(batch.id, batch.endpoint, batch.model, created, row))
        for dl in iter_dead_letters(store):
            cid = dl.get("id")
            if cid in line_of and cid not in done:
                done.add(cid)
                errors.append(error_line(batch.id, cid, line_of[cid], str(dl.get("reason")), str(dl.get("detail"))))
    code = UNFINISHED_CODES.get(final_status, "batch_failed")
    for cid, line in requests:
        if cid not in done:
            errors.append(error_line(batch.id, cid, line, code,
                                     f"the request was not run: the batch ended {final_status}"))
    return BuiltFiles(output=jsonl(outputs), errors=jsonl(errors), completed=len(outputs), failed=len(errors))
