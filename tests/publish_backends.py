"""Per-backend targets and readers for the backend-agnostic publish tests (DuckDB file, Iceberg warehouse).

A reader answers DuckDB SQL over what a consumer of the backend would see: for DuckDB the database file
itself; for Iceberg an in-memory DuckDB holding each table's current snapshot (read with pyiceberg),
``<t>__previous`` / ``<t>__dead_letters__previous`` from the rollback tags and ``<t>__publish_log``
in commit order (so ``ORDER BY rowid`` is the log order), each in a DuckDB schema named like its
namespace. Published tables live in the target's schema (default ``batch_inference``), so queries name
it: ``SELECT ... FROM batch_inference.emb``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
from batch_inference.publish import PublishTarget
from batch_inference.publish.target import DEFAULT_SCHEMA, REGISTRY_TABLE, SUFFIX_PREVIOUS, SUFFIX_PUBLISH_LOG

BACKENDS = ("duckdb", "iceberg")


@dataclass
class Published:
    """Target factory and reader for one backend under one test directory."""

    backend: str
    root: Path

    def target(self, table: str = "emb", schema: str = DEFAULT_SCHEMA) -> PublishTarget:
        if self.backend == "iceberg":
            return PublishTarget(backend="iceberg", table=table, schema=schema,
                                 iceberg_warehouse=str(self.root / "iceberg" / "warehouse"))
        return PublishTarget(backend="duckdb", table=table, schema=schema, duckdb_path=str(self.root / "w.duckdb"))

    def query(self, sql: str) -> list[tuple]:
        con = self._connect()
        try:
            return con.execute(sql).fetchall()
        finally:
            con.close()

    def tables(self) -> set[str]:
        """Names of the tables a reader can see (live and previous; staging only where it is a table; not
        publish's registry of the tables it created)."""
        return {r[0] for r in self.query("SELECT table_name FROM duckdb_tables()")} - {REGISTRY_TABLE}

    def _connect(self) -> duckdb.DuckDBPyConnection:
        if self.backend == "duckdb":
            return duckdb.connect(str(self.root / "w.duckdb"), read_only=True)
        return iceberg_snapshot_db(self.target())


def iceberg_snapshot_db(target: PublishTarget) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with every publish table of the target's warehouse, as pyiceberg reads them."""
    from batch_inference.publish.iceberg_backend import load_catalog, previous_snapshot

    catalog = load_catalog(target)
    con = duckdb.connect()
    for ns in catalog.list_namespaces():
        prefix = ns[0]
        con.execute(f'CREATE SCHEMA IF NOT EXISTS "{prefix}"')
        for ident in catalog.list_tables(ns):
            table = catalog.load_table(ident)
            name = ident[-1]
            if name.endswith(SUFFIX_PUBLISH_LOG):
                data = _log_in_commit_order(table)
            elif table.current_snapshot() is None:
                data = table.schema().as_arrow().empty_table()
            else:
                data = table.scan().to_arrow()
            _create(con, prefix, name, data)
            prev = previous_snapshot(table, name + SUFFIX_PREVIOUS)
            if prev is not None:
                _create(con, prefix, name + SUFFIX_PREVIOUS, table.scan(snapshot_id=prev.snapshot_id).to_arrow())
    return con


def _create(con: duckdb.DuckDBPyConnection, schema: str, name: str, data: pa.Table) -> None:
    con.register("_data", data)
    con.execute(f'CREATE TABLE "{schema}"."{name}" AS SELECT * FROM _data')
    con.unregister("_data")


def _log_in_commit_order(table) -> pa.Table:
    parts = []
    for snap in sorted(table.snapshots(), key=lambda s: s.sequence_number):
        for manifest in snap.manifests(table.io):
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                if entry.snapshot_id == snap.snapshot_id:
                    parts.append(pq.read_table(entry.data_file.file_path.removeprefix("file://")))
    return pa.concat_tables(parts) if parts else table.schema().as_arrow().empty_table()


def snapshot_runs(target: PublishTarget, suffix: str = "") -> list[str]:
    """Run ids of the snapshots of ``<table><suffix>`` in commit order, the current one last."""
    from batch_inference.publish.iceberg_backend import load_catalog, namespace, snapshot_record

    table = load_catalog(target).load_table((namespace(target), target.name(suffix)))
    current = table.current_snapshot()
    runs = [(r.run_id if (r := snapshot_record(s)) else "?") for s in table.snapshots() if s is not current]
    return runs + ([r.run_id if (r := snapshot_record(current)) else "?"] if current else [])
