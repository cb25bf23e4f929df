"""The observability suite (``make test-observability``): one Airflow deployment of its own (API server,
scheduler with LocalExecutor, triggerer and DAG processor on PostgreSQL: ``tests/airflow_services.py``),
the DAGs of ``dags/observability_dags.py`` and three runs triggered together through the REST API:

- ``obs_slow``: one shard slowed to 5% speed once it is running (``throttled_worker.py``) until its
  deadline alert has fired: the deadline (``OBS_DEADLINE_HOURS``) passes while it runs;
- ``obs_fail``: one of two shards fails for good: the run ends below ``min_success_ratio``;
- ``obs_budget``: ``budget_usd`` 0, one worker at a time: the budget stop leaves shards unstarted.

Alerts go through ``BATCH_INFERENCE_ALERT_NOTIFIER=alert_sink.to_file`` to a JSON-lines file; every
component's metrics go to an OTLP/HTTP receiver (``tests/otlp_receiver.py``) through Airflow's own OTel
backend; OpenLineage events go through the provider's own file transport. At the end
of the session ``build/observability/summary.json`` holds what the tests recorded
(``obs_deployment.record``); ``make test-observability`` prints it as its last line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from airflow_services import AirflowServices, create_database, sqlalchemy_url
from obs_deployment import DAG_IDS, DEADLINE_HOURS, RUN_TIMEOUT_S, record, write_summary
from otlp_receiver import OtlpReceiver

HERE = Path(__file__).resolve().parent


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    write_summary(exitstatus == 0)


def _input(sample: Path, tmp: Path, rows: int, name: str) -> str:
    path = tmp / "in" / f"{name}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pq.read_table(sample).slice(0, rows), path)
    return str(path)


def _conf(tmp: Path, input_uri: str, table: str, rows_per_shard: int, **extra: Any) -> dict[str, Any]:
    return {"input_uri": input_uri, "output_root": str(tmp / "out"), "runner": "local",
            "rows_per_shard": rows_per_shard, "shard_by": "rows", "reuse": "off", "canary": False,
            "duckdb_path": str(tmp / "warehouse.duckdb"), "output_table": table, **extra}


@pytest.fixture(scope="session")
def deployment(tmp_path_factory: pytest.TempPathFactory, sample_parquet: Path):
    """The deployment, its three runs finished: ``{"svc", "tmp", "alerts_file", "metrics" (the
    :class:`OtlpReceiver`), "lineage_file" (the OpenLineage file transport's), "runs": {dag_id: {"run_id",
    "state"}}}``."""
    import pg_fixture
    from batch_inference.cli import airflow_env

    tmp = tmp_path_factory.mktemp("observability")
    alerts_file = tmp / "alerts.jsonl"
    env = airflow_env(tmp / "airflow_home")
    env.update({
        "AIRFLOW__CORE__DAGS_FOLDER": str(HERE / "dags"),
        "PYTHONPATH": f"{HERE}:{env['PYTHONPATH']}",
        "OBS_DEADLINE_HOURS": str(DEADLINE_HOURS),
        "OBS_ALERT_FILE": str(alerts_file),
        "BATCH_INFERENCE_DEADLINE_CALLBACK": "batch_inference.notifiers.log_deadline_missed",
        "BATCH_INFERENCE_ALERT_NOTIFIER": "alert_sink.to_file",
        "BATCH_WORKER_COMMAND": f"{sys.executable} {HERE / 'throttled_worker.py'}",
        "BATCH_INFERENCE_ALLOWED_ROOTS": str(tmp),
    })
    lineage_file = tmp / "openlineage_events.jsonl"
    env.update({"AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(lineage_file),
                                                               "append": True}),
                "AIRFLOW__OPENLINEAGE__NAMESPACE": "observability-suite"})
    receiver = OtlpReceiver().start()
    env.update({"AIRFLOW__METRICS__OTEL_ON": "True", "AIRFLOW__METRICS__OTEL_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__OTEL_PORT": str(receiver.port),
                "AIRFLOW__METRICS__OTEL_INTERVAL_MILLISECONDS": "1000", "AIRFLOW__METRICS__OTEL_PREFIX": "airflow"})
    env = {k: v for k, v in env.items() if not k.startswith("OTEL_")}  # Airflow would prefer them
    dsn, pg_dir = pg_fixture.start_cluster()
    try:
        create_database(dsn, "airflow")
        svc = AirflowServices(tmp / "airflow_home", env, sqlalchemy_url(dsn, "airflow"))
        svc.start(DAG_IDS)
        try:
            confs = {
                "obs_slow": _conf(tmp, _input(sample_parquet, tmp, 3000, "slow"), "obs_slow", 3000),
                "obs_fail": _conf(tmp, _input(sample_parquet, tmp, 200, "fail"), "obs_fail", 100),
                "obs_budget": _conf(tmp, _input(sample_parquet, tmp, 300, "budget"), "obs_budget", 100,
                                    budget_usd=0.0, parallelism=1),
            }
            run_ids = {dag_id: svc.trigger(dag_id, conf) for dag_id, conf in confs.items()}
            runs = {dag_id: {"run_id": run_id, "state": svc.wait_run(dag_id, run_id, RUN_TIMEOUT_S)}
                    for dag_id, run_id in run_ids.items()}
            record(services_start_s=round(svc.start_seconds, 1))
            yield {"svc": svc, "tmp": tmp, "alerts_file": alerts_file, "runs": runs, "metrics": receiver,
                   "lineage_file": lineage_file}
        finally:
            svc.stop()
    finally:
        pg_fixture.stop_cluster(pg_dir)
        receiver.stop()


@pytest.fixture(scope="session")
def alerts(deployment) -> list[dict[str, Any]]:
    """Every alert the deployment's notifier delivered (the JSON lines of ``alerts_file``)."""
    path = deployment["alerts_file"]
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
