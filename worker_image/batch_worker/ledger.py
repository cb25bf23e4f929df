"""Resume ledger: what this shard already committed under the current fingerprint.

Storage is the truth: the ledger is rebuilt on every start by listing the shard directory and reading
only the ``id``/``fingerprint`` (and, for dead letters, ``source_uri``/``source_row``) columns of
committed files. A committed file that cannot be read (torn, truncated, not Parquet) or that was written
under another fingerprint is quarantined (:mod:`batch_contract.partfiles`): moved aside, never reused,
never deleted; its rows are then not in the ledger, so this attempt recomputes them.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from batch_contract import storage
from batch_contract.layout import DEAD_LETTER_PREFIX, PART_PREFIX, chunk_of, join_uri
from batch_contract.partfiles import quarantine


@dataclass
class Ledger:
    """Committed work of one shard under one fingerprint.

    Attributes:
        done_ids: ids with a result in a part file.
        done_dead: ``(source_uri, source_row)`` of dead-lettered rows.
        parts / dead_letter_parts: committed file names (this fingerprint).
        quarantined: files this build moved to ``quarantine/`` (unreadable or another fingerprint).
        next_chunk: first free chunk number (above every committed file of any fingerprint).
    """

    done_ids: set[str] = field(default_factory=set)
    done_dead: set[tuple[str, int]] = field(default_factory=set)
    parts: list[str] = field(default_factory=list)
    dead_letter_parts: list[str] = field(default_factory=list)
    quarantined: list[str] = field(default_factory=list)
    next_chunk: int = 0

    @property
    def rows_done(self) -> int:
        return len(self.done_ids) + len(self.done_dead)


def read_parquet_columns(uri: str, columns: list[str]):
    """Read some columns of a committed Parquet object (local or remote, ``gs://``) as an Arrow table:
    a local file in place, a remote object through one :func:`~batch_contract.storage.read_bytes`."""
    if storage.is_local(uri):
        return pq.read_table(str(storage.local_path(uri)), columns=columns)
    return pq.read_table(io.BytesIO(storage.read_bytes(uri)), columns=columns)


def _read_committed(uri: str, name: str) -> pa.Table:
    """Key columns of one committed file (raises what pyarrow raises for a torn file)."""
    if name.startswith(PART_PREFIX):
        return read_parquet_columns(uri, ["id", "fingerprint"])
    return read_parquet_columns(uri, ["id", "fingerprint", "source_uri", "source_row"])


def build_ledger(shard_dir: str, fingerprint: str, temp_min_age_seconds: float = 0.0) -> Ledger:
    """List and read the shard directory's committed files and return the ledger for ``fingerprint``.

    Stray temp files from a killed writer are removed first (``storage.clean_temp``; with
    ``temp_min_age_seconds`` > 0 only those at least that old: other workers may be committing into the
    shard now, under work stealing); unreadable and other-fingerprint files are quarantined (see the
    module docstring).
    """
    storage.clean_temp(shard_dir, temp_min_age_seconds)
    ledger = Ledger()
    for name in storage.list_names(shard_dir):
        chunk = chunk_of(name)
        if chunk is None or not name.startswith((PART_PREFIX, DEAD_LETTER_PREFIX)):
            continue
        ledger.next_chunk = max(ledger.next_chunk, chunk + 1)
        uri = join_uri(shard_dir, name)
        try:
            table = _read_committed(uri, name)
        except (pa.ArrowInvalid, OSError, KeyError) as exc:
            if isinstance(exc, FileNotFoundError):
                continue  # moved aside by another attempt meanwhile
            quarantine(shard_dir, name, f"unreadable committed file ({exc})")
            ledger.quarantined.append(name)
            continue
        fps = set(table.column("fingerprint").unique().to_pylist())
        if fps != {fingerprint}:
            if table.num_rows:
                quarantine(shard_dir, name, f"committed under fingerprint(s) {sorted(map(str, fps))}, "
                                            f"not the current {fingerprint}")
                ledger.quarantined.append(name)
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
