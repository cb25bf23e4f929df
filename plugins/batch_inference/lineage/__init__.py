"""OpenLineage lineage of the batch-inference DAGs: the ``plan`` and ``publish`` tasks report the run's
input (file or prefix), the table written (DuckDB, PostgreSQL, Iceberg) and, as a run facet, the model
and the fingerprints, through the Airflow OpenLineage provider's listener and transport.

Modules: ``operator`` (``@lineage_task``: what the DAG factory wires; imported at parse time, cheap),
``collect`` (what each task reports, from the run's context; run time), ``naming`` (OpenLineage dataset
names; no OpenLineage import), ``facets`` (the OpenLineage objects and the ``batchInference`` run facet,
whose JSON Schema is ``BatchInferenceRunFacet.json``; imported only by the provider's listener). Without
the provider, or with OpenLineage disabled, nothing is collected. See ``docs/observability.md``.
"""
