"""The run as planned: where the plan task put the run, its manifest, and the config recorded in it.

The plan task (``batch_inference.tasks.plan_task``) is the only one that resolves the Params; it records
the resolved :class:`~batch_inference.params.RunConfig` in the manifest's ``params`` and pushes the run
dir as XCom ``run_dir``. Every later task (canary, fan-out, budget stop, approval, publish) reads the run
back from here, so all tasks of a run see one config. Airflow side; reads only (no Airflow import).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from batch_contract.engine_config import ConfigError
from batch_contract.layout import RunLayout
from batch_contract.manifest import Manifest
from batch_contract.runstore import RunStore

from batch_inference.params import RunConfig


def run_dir_of(cfg: RunConfig, run_id: str, dag_id: str) -> str:
    """``<output_root>/runs/<dag_id>/<run_id>`` (:class:`batch_contract.layout.RunLayout`)."""
    return RunLayout(cfg.output_root, run_id, dag_id).run_dir


def manifest_for(run_dir: str) -> Manifest:
    """The committed manifest of ``run_dir``, read through the run store.

    Raises:
        FileNotFoundError: the run was never planned (no manifest under ``run_dir``).
    """
    return RunStore.open(run_dir).manifest


def run_config_of(manifest: Manifest) -> RunConfig:
    """The :class:`RunConfig` the plan task resolved, read back from ``manifest.params`` (other keys
    there, such as ``dag_id``, are ignored; a field missing from an older manifest takes its default)."""
    names = {f.name for f in fields(RunConfig)}
    return RunConfig(**{k: v for k, v in manifest.params.items() if k in names})


def planned_run(context: Mapping[str, Any]) -> tuple[RunConfig, Manifest, str]:
    """``(config, manifest, run_dir)`` of this run as planned: the run dir the plan task pushed as XCom
    ``run_dir``, its manifest, and the resolved config recorded in it.

    Raises:
        ConfigError: the plan task pushed no run dir (it did not run in this DAG run).
        FileNotFoundError: no manifest under that run dir.
    """
    run_dir = context["ti"].xcom_pull(task_ids="plan", key="run_dir")
    if not run_dir:
        raise ConfigError("run_dir: the plan task pushed no XCom 'run_dir' in this DAG run; plan first")
    manifest = manifest_for(run_dir)
    return run_config_of(manifest), manifest, run_dir


__all__ = ["manifest_for", "planned_run", "run_config_of", "run_dir_of"]
