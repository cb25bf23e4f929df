"""The ``canary`` task: run the pre-flight canary, project the run, decide go or refuse.

Between ``plan`` and the fan-out. With the ``canary`` Param on, the canary runs where the run's shards
will run: with the local runner, ``batch-worker canary`` as a subprocess (``local_runner.run_canary``) at a
fan-out worker's thread cap (:func:`canary_task`, :func:`local_canary`); with the kubernetes runner, as a
pod with the shard pods' image and spec (``batch_inference.canary_pod.CanaryPodOperator``). Both then call
:func:`project_canary` (read ``canary.json``, project the run with
:func:`batch_inference.projection.project`, write ``runs/<run_id>/projection.json``) and :func:`decide`
(log the projection table, return a short summary for XCom). A refused run (over ``budget_usd``, past
``deadline_hours``, or outputs that disagree with a previous model's published rows:
``batch_inference.upgrade_gate``) fails the task with an ``AirflowFailException`` whose message starts with
``REFUSED``: the fan-out tasks are then ``upstream_failed`` (no shard starts) and the completion gate
fails with the same message.

Airflow side: no torch import (the canary runs in a worker subprocess or pod).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from batch_contract.layout import RunLayout
from batch_contract.runstore import RunStore

from batch_inference.local_runner import (
    ShardBadInputError,
    ShardRetryableError,
    auto_parallelism,
    machine_cores,
    run_canary,
)
from batch_inference.params import RunConfig
from batch_inference.planned import planned_run
from batch_inference.pricing import cost_params_from_dict
from batch_inference.projection import Limits, format_table, project, read_projection

log = logging.getLogger(__name__)


def canary_options(cfg: RunConfig) -> list[str]:
    """``batch-worker canary`` arguments from the run's Params."""
    return ["--fraction", str(cfg.canary_fraction), "--min-rows", str(cfg.canary_min_rows),
            "--max-seconds", str(cfg.canary_max_seconds)]


def refusal_message(run_dir: str) -> str | None:
    """The refusal message when the canary refused the run, else ``None``."""
    try:
        projection = read_projection(run_dir)
    except (OSError, ValueError):
        return None
    if projection and projection.get("decision", "go") != "go":
        return str(projection.get("message"))
    return None


def _elapsed_seconds(context: Mapping[str, Any]) -> float:
    """Seconds since the DAG run started (0.0 when unknown)."""
    start = getattr(context.get("dag_run"), "start_date", None)
    if start is None:
        return 0.0
    return max(0.0, (datetime.now(UTC) - start).total_seconds())


def _skip_reason(cfg: RunConfig, shards: int, runners: tuple[str, ...]) -> str | None:
    if not cfg.canary:
        return "the canary Param is off"
    if cfg.dry_run:
        return "dry run"
    if not shards:
        return "no rows"
    if cfg.runner not in runners:
        return f"runner {cfg.runner!r} is not enabled in this deployment (choose_runner fails the run)"
    return None


def _all_complete(run_dir: str, shards: int) -> str | None:
    """``"every shard is already complete"`` when nothing is left to run (a rerun, or every shard carried
    over from an earlier run): the canary would only load the model."""
    done = len(RunStore.open(run_dir).poll())
    return "every shard is already complete (carried over or run before)" if done >= shards else None


def skip_reason(cfg: RunConfig, manifest: Any, run_dir: str, runners: tuple[str, ...] = ("local",)) -> str | None:
    """Why this run has no canary (Param off, dry run, no rows, a runner the task cannot run it for,
    every shard already complete), or ``None`` when it must run.

    Args:
        runners: the runners the calling task runs the canary for (the plain task: ``local``; the
            ``CanaryPodOperator``: ``local`` and ``kubernetes``).
    """
    return (_skip_reason(cfg, len(manifest.shards), runners)
            or _all_complete(run_dir, len(manifest.shards)))


def project_canary(cfg: RunConfig, manifest: Any, run_dir: str, *, wall_seconds: float,
                   elapsed_seconds: float, parallelism: int, cores: int) -> dict[str, Any]:
    """Read the run's ``canary.json``, project the run and write ``projection.json`` (both runners).

    Args:
        wall_seconds: the canary's wall time, its start-up included (the local subprocess's wall, or the
            canary pod's creation to its container's exit), in seconds.
        elapsed_seconds: seconds of the DAG run spent before the canary started.
        parallelism / cores: the local runner's workers at once and the machine's cores
            (:class:`batch_inference.projection.Limits`; the kubernetes runner's projection ignores them
            and considers 1..``max_gpus`` pods).

    Returns:
        The projection dict (``decision`` ``go`` / ``refused_budget`` / ``refused_deadline`` /
        ``refused_upgrade``; ``upgrade``: the upgrade check's section unless ``upgrade_gate`` is off).

    Raises:
        RuntimeError: there is no ``canary.json`` (the worker exited 0 without writing it).
    """
    store = RunStore.open(run_dir)
    canary = store.canary()
    if canary is None:
        raise RuntimeError(f"canary: the worker exited 0 but wrote no {store.layout.canary_uri}")
    limits = Limits(runner=cfg.runner, cores=cores, parallelism=parallelism, max_gpus=cfg.max_gpus,
                    deadline_hours=cfg.deadline_hours, budget_usd=cfg.budget_usd, elapsed_seconds=elapsed_seconds)
    projection = project(canary, manifest, limits, cost_params_from_dict(cfg.cost_params()),
                         canary_wall_seconds=wall_seconds)
    projection["created_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    if cfg.upgrade_gate != "off":  # compare with the previous model's published rows (upgrade_gate.py)
        from batch_inference import upgrade_gate  # numpy, pyarrow.compute, duckdb: only when the gate is on

        projection = upgrade_gate.apply(projection, cfg, run_dir, canary)
    store.write_projection(projection)
    return projection


def canary_and_project(cfg: RunConfig, manifest: Any, run_dir: str, elapsed_seconds: float = 0.0) -> dict[str, Any]:
    """Local runner: run the canary subprocess (once per run: a retry reuses ``projection.json``) and
    project the run (:func:`project_canary`).

    Returns:
        The projection dict (``decision`` ``go`` / ``refused_budget`` / ``refused_deadline`` /
        ``refused_upgrade``; ``upgrade``: the upgrade check's section unless ``upgrade_gate`` is off).

    Raises:
        ShardBadInputError / ShardRetryableError: the canary worker failed (see ``local_runner.run_canary``).
    """
    existing = read_projection(run_dir)
    if existing is not None:
        log.info("canary: %s exists: reusing its projection", RunLayout.from_run_dir(run_dir).projection_uri)
        return existing
    parallelism = cfg.parallelism or auto_parallelism()
    wall = run_canary(run_dir, parallelism=parallelism, options=canary_options(cfg))
    return project_canary(cfg, manifest, run_dir, wall_seconds=wall, elapsed_seconds=elapsed_seconds,
                          parallelism=parallelism, cores=machine_cores())


def decide(projection: dict[str, Any]) -> dict[str, Any]:
    """Log the projection table and go on, or refuse (both runners).

    Returns:
        ``{"decision": "go", "message", "parallelism", "cost_usd", "finish_seconds", "token_budget"}``.

    Raises:
        AirflowFailException: the projection refused the run (message ``REFUSED (budget|deadline|upgrade): ...``).
    """
    from airflow.sdk.exceptions import AirflowFailException

    for line in format_table(projection).splitlines():
        log.info("%s", line)
    if projection["decision"] != "go":
        raise AirflowFailException(projection["message"])
    chosen = projection["chosen"]
    return {"decision": "go", "message": projection["message"], "parallelism": chosen["parallelism"],
            "cost_usd": chosen["cost_usd"], "finish_seconds": chosen["finish_seconds"],
            "token_budget": projection["canary"]["token_budget"]}


def skipped(why: str) -> dict[str, Any]:
    """The task's result when the canary does not run: ``{"decision": "skipped", "message": why}``."""
    log.info("canary skipped: %s", why)
    return {"decision": "skipped", "message": why}


def local_canary(cfg: RunConfig, manifest: Any, run_dir: str, context: Mapping[str, Any]) -> dict[str, Any]:
    """The local runner's canary: :func:`canary_and_project`, then :func:`decide`.

    Raises:
        AirflowFailException: refused, or the canary hit bad input or config (worker exit 2).
        AirflowException: the canary worker failed otherwise (retried).
    """
    from airflow.sdk.exceptions import AirflowException, AirflowFailException

    try:
        projection = canary_and_project(cfg, manifest, run_dir, _elapsed_seconds(context))
    except ShardBadInputError as exc:
        raise AirflowFailException(str(exc)) from None
    except ShardRetryableError as exc:
        raise AirflowException(str(exc)) from None
    return decide(projection)


def canary_task(context: Mapping[str, Any]) -> dict[str, Any]:
    """Task body of the plain ``canary`` task (DAGs built with the local runner only; with the kubernetes
    runner enabled the task is ``canary_pod.CanaryPodOperator``).

    Returns:
        :func:`decide`'s summary, or ``{"decision": "skipped", "message": why}``.

    Raises:
        AirflowFailException: the run was refused (message ``REFUSED (budget|deadline): ...``), or the
            canary hit bad input or config.
        AirflowException: the canary worker failed otherwise (retried).
    """
    cfg, manifest, run_dir = planned_run(context)
    why = skip_reason(cfg, manifest, run_dir)
    if why:
        return skipped(why)
    return local_canary(cfg, manifest, run_dir, context)


__all__ = ["canary_and_project", "canary_options", "canary_task", "decide", "local_canary", "project_canary",
           "refusal_message", "skip_reason", "skipped"]
