"""OpenLineage objects of a :class:`~batch_inference.lineage.collect.TaskLineage`: datasets with the
standard facets, and the ``batchInference`` run facet of this project.

Imports the OpenLineage client (installed with ``apache-airflow-providers-openlineage``) at module level:
import this module only where the provider's listener asks for lineage
(:mod:`batch_inference.lineage.operator`), never at DAG parse time.

Facets written (each with ``_producer`` = :data:`PRODUCER` and the ``_schemaURL`` of its schema):

* input dataset: ``inputStatistics`` (rows read, files, bytes) once the plan has run;
* output table: ``outputStatistics`` (rows it holds), ``version`` (the run id it holds) after publish;
  Iceberg tables also ``symlinks`` (the catalog name) and ``catalog``;
* run: ``batchInference`` (:class:`BatchInferenceRunFacet`), schema ``BatchInferenceRunFacet.json``
  beside this module.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import Any

from attrs import define, field
from openlineage.client.event_v2 import InputDataset, OutputDataset
from openlineage.client.facet_v2 import (
    RunFacet,
    catalog_dataset,
    dataset_version_dataset,
    input_statistics_input_dataset,
    output_statistics_output_dataset,
    symlinks_dataset,
)

from batch_inference.lineage.collect import InputRef, OutputRef, RunFacts, TaskLineage
from batch_inference.lineage.naming import TableId


def _version() -> str:
    try:
        return metadata.version("airflow-batch-inference")
    except metadata.PackageNotFoundError:
        return "dev"


PRODUCER = f"https://github.com/airflow-batch-inference/tree/{_version()}"
"""``_producer`` of every facet this module writes: this project, at its installed version."""
RUN_FACET_KEY = "batchInference"
"""Key of :class:`BatchInferenceRunFacet` in an event's ``run.facets``."""
RUN_FACET_SCHEMA_PATH = Path(__file__).with_name("BatchInferenceRunFacet.json")
"""The facet's JSON Schema (draft 2020-12), whose ``$id`` is :data:`RUN_FACET_SCHEMA_ID`."""
RUN_FACET_SCHEMA_ID = "https://github.com/airflow-batch-inference/lineage/1-0-0/BatchInferenceRunFacet.json"
RUN_FACET_SCHEMA_URL = RUN_FACET_SCHEMA_ID + "#/$defs/BatchInferenceRunFacet"
"""``_schemaURL`` of :class:`BatchInferenceRunFacet`: bump ``1-0-0`` with any change to its fields."""


@define
class BatchInferenceRunFacet(RunFacet):
    """Which model and engine config made a batch-inference run's rows (fields: see
    :class:`~batch_inference.lineage.collect.RunFacts`; ``None`` ones are left out of the JSON).

    Attributes:
        engine: engine kind. model: model directory. modelVersion: the Asset event's ``model_version``.
        modelDigest: SHA-256 (64 hex) of the model files. configFingerprint / resultFingerprint: 32 hex
        characters each. runDir: the run's directory (manifest, shards, report).
    """

    engine: str
    model: str | None = field(default=None)
    modelVersion: str | None = field(default=None)  # noqa: N815 - OpenLineage facet fields are camelCase
    modelDigest: str | None = field(default=None)  # noqa: N815
    configFingerprint: str | None = field(default=None)  # noqa: N815
    resultFingerprint: str | None = field(default=None)  # noqa: N815
    runDir: str | None = field(default=None)  # noqa: N815

    _additional_skip_redact = ["engine", "modelDigest", "configFingerprint", "resultFingerprint"]

    @staticmethod
    def _get_schema() -> str:
        return RUN_FACET_SCHEMA_URL


def run_facet(facts: RunFacts) -> BatchInferenceRunFacet:
    """The ``batchInference`` run facet of ``facts``."""
    return BatchInferenceRunFacet(
        engine=facts.engine, model=facts.model, modelVersion=facts.model_version, modelDigest=facts.model_digest,
        configFingerprint=facts.config_fingerprint, resultFingerprint=facts.result_fingerprint,
        runDir=facts.run_dir, producer=PRODUCER,
    )


def input_dataset(ref: InputRef) -> InputDataset:
    """The OpenLineage input dataset of ``ref``, with ``inputStatistics`` when its rows are known."""
    facets: dict[str, Any] = {}
    if ref.rows is not None:
        facets["inputStatistics"] = input_statistics_input_dataset.InputStatisticsInputDatasetFacet(
            rowCount=ref.rows, fileCount=ref.files, size=ref.size_bytes, producer=PRODUCER)
    return InputDataset(namespace=ref.dataset.namespace, name=ref.dataset.name, inputFacets=facets)


def _table_facets(table: TableId) -> dict[str, Any]:
    facets: dict[str, Any] = {}
    if table.symlinks:
        facets["symlinks"] = symlinks_dataset.SymlinksDatasetFacet(
            identifiers=[symlinks_dataset.Identifier(namespace=ns, name=name, type=kind)
                         for ns, name, kind in table.symlinks], producer=PRODUCER)
    if table.catalog is not None:
        facets["catalog"] = catalog_dataset.CatalogDatasetFacet(
            framework="iceberg", type=table.catalog.type, name=table.catalog.name,
            warehouseUri=table.catalog.warehouse_uri, metadataUri=table.catalog.metadata_uri, source="pyiceberg",
            producer=PRODUCER)
    return facets


def output_dataset(ref: OutputRef) -> OutputDataset:
    """The OpenLineage output dataset of ``ref``: ``version`` and ``outputStatistics`` when publish has
    run, plus the table's own facets (Iceberg: ``symlinks``, ``catalog``)."""
    facets = _table_facets(ref.table)
    if ref.version:
        facets["version"] = dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=ref.version,
                                                                               producer=PRODUCER)
    output_facets: dict[str, Any] = {}
    if ref.rows is not None:
        output_facets["outputStatistics"] = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
            rowCount=int(ref.rows), producer=PRODUCER)
    return OutputDataset(namespace=ref.table.dataset.namespace, name=ref.table.dataset.name, facets=facets,
                         outputFacets=output_facets)


def operator_lineage(lineage: TaskLineage) -> Any:
    """The provider's ``OperatorLineage`` of ``lineage``: what ``get_openlineage_facets_on_*`` returns."""
    from airflow.providers.openlineage.extractors import OperatorLineage

    return OperatorLineage(inputs=[input_dataset(i) for i in lineage.inputs],
                           outputs=[output_dataset(o) for o in lineage.outputs],
                           run_facets={RUN_FACET_KEY: run_facet(lineage.run)})


__all__ = ["PRODUCER", "RUN_FACET_KEY", "RUN_FACET_SCHEMA_PATH", "RUN_FACET_SCHEMA_URL", "BatchInferenceRunFacet",
           "input_dataset", "operator_lineage", "output_dataset", "run_facet"]
