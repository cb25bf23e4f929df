"""Iceberg publish through a real DAG run, deployed as on GKE: a SQL catalog in PostgreSQL, the warehouse on gs://.

One ``airflow dags test batch_inference_backfill`` (local runner, 200 rows in 2 shards, input and
output_root on the fake-gcs-server emulator) with ``publish_backend=iceberg`` and
``iceberg_catalog_conn_id`` naming an Airflow connection given as ``AIRFLOW_CONN_<ID>=postgresql://...``
(the test PostgreSQL). The published tables are then read back independently of the product: plain
pyiceberg ``SqlCatalog`` over the same database, its own ``GcsFileSystem`` pointed at the emulator with
pyiceberg's ``gcs.*`` properties. Every input id must be in exactly one of the results and the dead
letters, and every published vector must match sentence-transformers (:mod:`st_reference`).
"""

from __future__ import annotations

import io
import json
import os
import time
from collections import Counter
from pathlib import Path

import gcs_fixture
import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract import storage
from pg_fixture import pg_dsn  # noqa: F401  (module-scoped server fixture)
from run_helpers import WORKER_ENV
from st_reference import check_published, texts_by_id

fake_gcs, gcs_bucket = gcs_fixture.fake_gcs, gcs_fixture.gcs_bucket

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "data" / "sample" / "debian_descriptions_sample.parquet"
CONN_ID = "iceberg_catalog_test"
TABLE = "emb_iceberg"
ROWS = 200
EMPTY_TEXT_ROWS = (7, 120, 199)
"""Input rows whose text is blanked: dead letters (``empty_text``), one per shard at least."""


def _input_table() -> pa.Table:
    """The sample's first :data:`ROWS` rows, with the texts of :data:`EMPTY_TEXT_ROWS` emptied."""
    table = pq.read_table(SAMPLE).slice(0, ROWS)
    texts = table.column("text").to_pylist()
    for i in EMPTY_TEXT_ROWS:
        texts[i] = ""
    return table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts, pa.string()))


def _catalog(dsn: str, warehouse: str):
    """The run's catalog, opened with pyiceberg alone (the product's catalog name; the emulator through
    pyiceberg's own ``gcs.service.host``, with a placeholder token the emulator ignores)."""
    from pyiceberg.catalog.sql import SqlCatalog

    expires_ms = int((time.time() + 3600) * 1000)  # pyarrow wants a token's expiry with the token
    return SqlCatalog("batch_inference", uri=dsn.replace("postgresql://", "postgresql+psycopg://", 1),
                      warehouse=warehouse, **{"gcs.service.host": os.environ["STORAGE_EMULATOR_HOST"],
                                              "gcs.oauth2.token": "emulator",
                                              "gcs.oauth2.token-expires-at": str(expires_ms)})


def test_backfill_dag_publishes_iceberg_on_gcs_with_a_postgres_catalog(
        gcs_bucket: str, pg_dsn: str, tmp_path: Path) -> None:  # noqa: F811
    from batch_inference.cli import airflow_env, dags_test, ensure_db

    table = _input_table()
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=50)
    input_uri = f"{gcs_bucket}/input/descriptions.parquet"
    storage.write_create_only(input_uri, buf.getvalue())
    output_root = f"{gcs_bucket}/dag-out"

    env = airflow_env(tmp_path / "airflow_home")
    env.update(WORKER_ENV, PYTHONPATH=f"{WORKER_ENV['PYTHONPATH']}{os.pathsep}{env['PYTHONPATH']}")
    env[f"AIRFLOW_CONN_{CONN_ID.upper()}"] = pg_dsn  # how a deployment hands Airflow a connection
    env["BATCH_INFERENCE_ALLOWED_CONN_IDS"] = CONN_ID  # and allows this DAG to publish through it
    ensure_db(env)
    conf = {"input_uri": input_uri, "output_root": output_root, "runner": "local", "rows_per_shard": 100,
            "row_limit": ROWS, "shard_by": "rows", "parallelism": 2, "output_table": TABLE,
            "publish_backend": "iceberg", "iceberg_catalog_conn_id": CONN_ID}
    log_path = tmp_path / "dags-test.log"
    code, report_uri = dags_test("batch_inference_backfill", conf, env, log_path)
    assert code == 0, log_path.read_text(errors="replace")[-6000:]
    assert report_uri.startswith(f"{output_root}/runs/"), report_uri
    report = json.loads(storage.read_bytes(report_uri))
    assert report, report_uri

    # The catalog lives in the PostgreSQL database of the connection (pyiceberg's SQL catalog tables).
    with psycopg.connect(pg_dsn) as conn:
        names = {r[0] for r in conn.execute(
            "SELECT table_name FROM iceberg_tables WHERE catalog_name = 'batch_inference' "
            "AND table_namespace = 'batch_inference'")}
    assert {TABLE, f"{TABLE}__dead_letters", f"{TABLE}__publish_log"} <= names, names

    warehouse = f"{output_root}/iceberg/warehouse"
    catalog = _catalog(pg_dsn, warehouse)
    results_table = catalog.load_table(("batch_inference", TABLE))
    assert results_table.location().startswith(f"{warehouse}/"), results_table.location()
    files = [t.file.file_path for t in results_table.scan().plan_files()]
    assert files and all(f.startswith(f"{warehouse}/") for f in files), files
    results = results_table.scan(selected_fields=("id", "embedding")).to_arrow()
    dead = catalog.load_table(("batch_inference", f"{TABLE}__dead_letters")).scan().to_arrow()
    log = catalog.load_table(("batch_inference", f"{TABLE}__publish_log")).scan().to_arrow()

    # every input id exactly once across the results and the dead letters
    input_ids = [str(i) for i in table.column("id").to_pylist()]
    published_ids = results.column("id").to_pylist()
    dead_ids = dead.column("id").to_pylist()
    assert Counter(published_ids + dead_ids) == Counter(input_ids)
    assert sorted(dead_ids) == sorted(input_ids[i] for i in EMPTY_TEXT_ROWS)
    assert set(dead.column("reason").to_pylist()) == {"empty_text"}
    assert results.num_rows == ROWS - len(EMPTY_TEXT_ROWS)
    assert log.column("action").to_pylist() == ["publish"]

    # every published vector against sentence-transformers
    check_published(zip(published_ids, results.column("embedding").to_pylist(), strict=True), texts_by_id(table))
