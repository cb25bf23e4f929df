"""What the ``plan`` and ``publish`` tasks report to OpenLineage, as plain records (no OpenLineage import).

Each function reads the run the way its task does (:func:`batch_inference.tasks.run_config` before the
plan exists, :func:`batch_inference.planned.planned_run` after) and returns a :class:`TaskLineage`:

=====================  ======================================  ==========================================
event                  inputs                                  outputs
=====================  ======================================  ==========================================
``plan`` START         ``input_uri`` as resolved from Params   none
``plan`` COMPLETE      the manifest's input, rows/files/bytes  none
``publish`` START      the same                                the table and its dead-letters table
``publish`` COMPLETE   the same                                both, with their rows and the run id held
=====================  ======================================  ==========================================

(``publish`` reports no output for a plan without rows: it writes nothing.)

The run facts (:class:`RunFacts`) name the model (path, Asset ``model_version``, weights digest), the
engine and the fingerprints: the config fingerprint from the plan on, the result fingerprint (config +
model digest + resolved settings, the one stamped on every published row) once ``publish`` has run.

These functions run in the task's own process, before the OpenLineage listener forks (Airflow calls,
XCom reads and connection lookups are safe there); they raise what the helpers they call raise, and the
caller (:mod:`batch_inference.lineage.operator`) logs it and reports nothing for that event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from batch_contract.manifest import Manifest, config_fingerprint
from batch_contract.runstore import RunStore

from batch_inference import tasks
from batch_inference.lineage.naming import DatasetId, TableId, path_dataset, table_id
from batch_inference.locations import default_model_path
from batch_inference.params import RunConfig
from batch_inference.planned import planned_run
from batch_inference.publish.target import SUFFIX_DEAD_LETTERS, PublishTarget
from batch_inference.run_target import publish_target


@dataclass(frozen=True)
class InputRef:
    """An input dataset and what the run reads of it (``None``: not known yet).

    Attributes:
        dataset: its identity (:func:`~batch_inference.lineage.naming.path_dataset` of ``input_uri``).
        rows: rows the run reads (the plan's rows: ``row_limit`` applied).
        files: data files the input resolved to.
        size_bytes: their total size in bytes (``None`` if any file's size is unknown).
    """

    dataset: DatasetId
    rows: int | None = None
    files: int | None = None
    size_bytes: int | None = None


@dataclass(frozen=True)
class OutputRef:
    """An output table and what publish left in it (``None``: not known yet).

    Attributes:
        table: its identity (:func:`~batch_inference.lineage.naming.table_id`).
        rows: rows the table holds after publish.
        version: the run id whose rows the table holds (publish replaces the whole table).
    """

    table: TableId
    rows: int | None = None
    version: str | None = None


@dataclass(frozen=True)
class RunFacts:
    """The ``batchInference`` run facet's content (:class:`~batch_inference.lineage.facets.BatchInferenceRunFacet`).

    Attributes:
        engine: engine kind (``encoder``, ``llm``).
        model: the model directory the run uses (``model_path``; for an encoder without one, the bundled
            default).
        model_version: the triggering Asset event's ``model_version`` (model-upgrade runs).
        model_digest: SHA-256 of the model files the workers hashed (from the report; ``publish`` COMPLETE).
        config_fingerprint: hash of the normalised engine config (32 hex characters).
        result_fingerprint: fingerprint of the published rows (config + model digest + resolved
            settings; ``publish`` COMPLETE).
        run_dir: ``<output_root>/runs/<dag_id>/<run_id>`` (``None`` before the plan wrote it).
    """

    engine: str
    model: str | None = None
    model_version: str | None = None
    model_digest: str | None = None
    config_fingerprint: str | None = None
    result_fingerprint: str | None = None
    run_dir: str | None = None


@dataclass(frozen=True)
class TaskLineage:
    """What one OpenLineage event of a task reports: datasets read and written, and the run facts."""

    run: RunFacts
    inputs: tuple[InputRef, ...] = field(default_factory=tuple)
    outputs: tuple[OutputRef, ...] = field(default_factory=tuple)


def _model_version(context: Mapping[str, Any], model_from_asset: bool) -> str | None:
    if not model_from_asset:
        return None
    extra = tasks.model_event_extra(context.get("triggering_asset_events"))
    version = (extra or {}).get("model_version")
    return str(version) if version else None


def _model(engine: Mapping[str, Any]) -> str | None:
    path = engine.get("model_path")
    if path:
        return str(path)
    return default_model_path() if engine.get("kind", "encoder") == "encoder" else None


def _manifest_input(manifest: Manifest) -> InputRef:
    files = manifest.input.files
    sizes = [f.size_bytes for f in files]
    return InputRef(dataset=path_dataset(manifest.input.uri), rows=manifest.rows, files=len(files),
                    size_bytes=sum(sizes) if all(s is not None for s in sizes) else None)


def _run_facts(manifest: Manifest, run_dir: str, model_version: str | None) -> RunFacts:
    return RunFacts(engine=str(manifest.engine["kind"]), model=_model(manifest.engine),
                    model_version=model_version, config_fingerprint=manifest.config_fingerprint, run_dir=run_dir)


def plan_start(context: Mapping[str, Any], *, model_from_asset: bool = False) -> TaskLineage:
    """The ``plan`` task's START: the input as the run's Params give it, resolved as the task resolves
    them (templates rendered, the Asset event's model applied), and the config fingerprint.

    Raises:
        ConfigError: the Params are invalid (the plan task will fail with the same message).
    """
    overrides: dict[str, Any] = {}
    if model_from_asset:
        overrides["model"], _ = tasks.model_from_events(context.get("triggering_asset_events"),
                                                        context["params"].get("model"))
    cfg = tasks.run_config(context, overrides)
    engine = cfg.engine_dict()
    return TaskLineage(
        run=RunFacts(engine=str(engine["kind"]), model=_model(engine),
                     model_version=_model_version(context, model_from_asset),
                     config_fingerprint=config_fingerprint(engine)),
        inputs=(InputRef(path_dataset(cfg.input_uri)),),
    )


def plan_complete(context: Mapping[str, Any], *, model_from_asset: bool = False) -> TaskLineage:
    """The ``plan`` task's COMPLETE: the input of the manifest it wrote (rows planned, files, bytes) and
    the run facts.

    Raises:
        ConfigError / FileNotFoundError: see :func:`batch_inference.planned.planned_run`.
    """
    _, manifest, run_dir = planned_run(context)
    return TaskLineage(run=_run_facts(manifest, run_dir, _model_version(context, model_from_asset)),
                       inputs=(_manifest_input(manifest),))


def _tables(target: PublishTarget) -> tuple[TableId, TableId]:
    """Identities of ``target``'s table and its dead-letters table."""
    kwargs = {"duckdb_path": target.duckdb_path, "dsn": target.dsn, "iceberg_warehouse_uri": target.iceberg_warehouse}
    return (table_id(target.backend, target.schema, target.table, **kwargs),
            table_id(target.backend, target.schema, target.name(SUFFIX_DEAD_LETTERS), **kwargs))


def publish_start(context: Mapping[str, Any], *, model_from_asset: bool = False) -> TaskLineage:
    """The ``publish`` task's START: the manifest's input, the target table and its dead-letters table
    (none for an empty plan: nothing will be written), and the run facts.

    Raises:
        ConfigError / FileNotFoundError: see :func:`batch_inference.planned.planned_run`; ConfigError
            also for a publish connection that cannot be resolved (:func:`~batch_inference.run_target.publish_target`).
        ValueError: the target cannot be named (see :func:`~batch_inference.lineage.naming.table_id`).
    """
    cfg, manifest, run_dir = planned_run(context)
    outputs: tuple[OutputRef, ...] = ()
    if manifest.shards:
        outputs = tuple(OutputRef(t) for t in _tables(publish_target(cfg)))
    return TaskLineage(run=_run_facts(manifest, run_dir, _model_version(context, model_from_asset)),
                       inputs=(_manifest_input(manifest),), outputs=outputs)


def _target_of(cfg: RunConfig, summary: Mapping[str, Any]) -> PublishTarget:
    """The run's target, with the table and schema publish reports having written."""
    target = publish_target(cfg)
    return PublishTarget(backend=target.backend, table=summary.get("table") or target.table,
                         schema=summary.get("schema") or target.schema, duckdb_path=target.duckdb_path,
                         dsn=target.dsn, iceberg_warehouse=target.iceberg_warehouse)


def publish_complete(context: Mapping[str, Any], result: Mapping[str, Any], *,
                     model_from_asset: bool = False) -> TaskLineage:
    """The ``publish`` task's COMPLETE: both tables with the rows publish left in them and the run id
    they hold (a run without input rows writes nothing: no outputs), the model digest from the run's
    report, and the result fingerprint the published rows carry.

    Args:
        result: the publish task's return value (``{"publish": <summary>, "report_json": <uri>, ...}``,
            see :func:`batch_inference.tasks.publish_and_report_task`).

    Raises:
        ConfigError / FileNotFoundError / ValueError: as :func:`publish_start`; KeyError: ``result`` has
            no ``publish`` summary.
    """
    cfg, manifest, run_dir = planned_run(context)
    summary = result["publish"]
    facts = _run_facts(manifest, run_dir, _model_version(context, model_from_asset))
    report = RunStore.open(run_dir).report() or {}
    digest = (report.get("engine") or {}).get("model_digest")
    facts = replace(facts, model_digest=str(digest) if digest else None,
                    result_fingerprint=summary.get("fingerprint"))
    outputs: tuple[OutputRef, ...] = ()
    if int(summary.get("rows_input") or 0) > 0:
        table, dead = _tables(_target_of(cfg, summary))
        version = summary.get("run_id")
        outputs = (OutputRef(table, rows=summary.get("rows_published"), version=version),
                   OutputRef(dead, rows=summary.get("rows_dead_letter"), version=version))
    return TaskLineage(run=facts, inputs=(_manifest_input(manifest),), outputs=outputs)


__all__ = ["InputRef", "OutputRef", "RunFacts", "TaskLineage", "plan_complete", "plan_start",
           "publish_complete", "publish_start"]
