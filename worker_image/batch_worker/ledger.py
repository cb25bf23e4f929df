"""Resume ledger: what this shard already committed under the current fingerprint.

Storage is the truth: the ledger is rebuilt on every start by listing the shard directory and reading
only the ``id``/``fingerprint`` (and, for dead letters, ``source_uri``/``source_row``) columns of
committed files. Files written under another fingerprint are ignored (never reused, never deleted).
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import pyarrow.parquet as pq
from batch_contract import storage
from batch_contract.layout import DEAD_LETTER_PREFIX, PART_PREFIX, chunk_of, join_uri


@dataclass
class Ledger:
    """Committed work of one shard under one fingerprint.

    Attributes:
        done_ids: ids with a result in a part file.
        done_dead: ``(source_uri, source_row)`` of dead-lettered rows.
        parts / dead_letter_parts: committed file names (this fingerprint).
        stale_files: committed files with another fingerprint (ignored).
        next_chunk: first free chunk number (above every committed file of any fingerprint).
    """

    done_ids: set[str] = field(default_factory=set)
    done_dead: set[tuple[str, int]] = field(default_factory=set)
    parts: list[str] = field(default_factory=list)
    dead_letter_parts: list[str] = field(default_factory=list)
    stale_files: list[str] = field(default_factory=list)
    next_chunk: int = 0

    @property
    def rows_done(self) -> int:
        return len(self.done_ids) + len(self.done_dead)


def read_parquet_columns(uri: str, columns: list[str]):
    """Read some columns of a committed Parquet object (local or ``gs://``) as an Arrow table."""
    if storage.is_gcs(uri):
        return pq.read_table(io.BytesIO(storage.read_bytes(uri)), columns=columns)
    return pq.read_table(str(storage.local_path(uri)), columns=columns)


def build_ledger(shard_dir: str, fingerprint: str) -> Ledger:
    """List and read the shard directory's committed files and return the ledger for ``fingerprint``.

    Stray temp files from a killed writer are removed first (``storage.clean_temp``).
    """
    storage.clean_temp(shard_dir)
    ledger = Ledger()
    for name in storage.list_names(shard_dir):
        chunk = chunk_of(name)
        if chunk is None:
            continue
        ledger.next_chunk = max(ledger.next_chunk, chunk + 1)
        uri = join_uri(shard_dir, name)
        if name.startswith(PART_PREFIX):
            table = read_parquet_columns(uri, ["id", "fingerprint"])
        elif name.startswith(DEAD_LETTER_PREFIX):
            table = read_parquet_columns(uri, ["id", "fingerprint", "source_uri", "source_row"])
        else:
            continue
        fps = set(table.column("fingerprint").unique().to_pylist())
        if fps != {fingerprint}:
            if table.num_rows:
                ledger.stale_files.append(name)
            continue
        if name.startswith(PART_PREFIX):
            ledger.done_ids.update(table.column("id").to_pylist())
            ledger.parts.append(name)
        else:
            ledger.done_dead.update(
                zip(table.column("source_uri").to_pylist(), table.column("source_row").to_pylist(), strict=True)
            )
            ledger.dead_letter_parts.append(name)
    return ledger
