"""The Airflow DAG of ``bench-scale``'s ``fanout`` stage: wiring only (``bench/scale_fanout.py``).

The words "airflow" and "dag" in this file are what Airflow's DAG discovery safe mode looks for."""

from scale_fanout import build_dag

dag = build_dag()
