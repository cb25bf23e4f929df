"""The ``canary`` task of DAGs built with the kubernetes runner: one task that runs the canary where the
run's shards will run, chosen when it runs (``runner`` is a run-time Param).

:class:`CanaryPodOperator` is a :class:`~batch_inference.shard_pod.ShardPodOperator` (so a
``KubernetesPodOperator``: the provider creates, watches, streams logs of and deletes the pod):

* ``runner=local`` (or no canary: Param off, dry run, no rows, every shard complete): no pod; the local
  path of ``canary_task`` (:func:`~batch_inference.canary_task.local_canary`) runs the canary subprocess;
* ``runner=kubernetes``: a pod with the shard pods' image and spec (``pod_spec.canary_pod_kwargs``: GPU
  node pool, resources, env, security context) runs ``batch-worker canary --run-dir <run_dir>
  <canary options>`` (``pod_spec.canary_command``); the task defers on it like a shard pod. A preempted
  canary pod (exit 75, pod vanished, node reclaimed) is replaced within the same try; exit 2 fails the
  task at once (no retry); other failures use the normal retries. When the pod has succeeded, the task
  reads ``canary.json``, projects with the kubernetes runner's limits (1..``max_gpus`` pods) and decides
  go or refuse exactly as the local path does (``canary_task.project_canary`` / ``canary_task.decide``).
  A retry after the projection was written reuses it and creates no pod.

The canary's wall time for the projection is the pod's creation to its container's exit
(``pod_outcome.run_window``: scheduling, image pull and process start-up included, as a shard pod pays
them); when the pod was garbage-collected before it could be read, the canary's own elapsed seconds.

The task's result (the ``return_value`` XCom) is the plain ``canary`` task's: ``canary_task.decide``'s
summary or ``{"decision": "skipped", ...}`` (pushed by the task itself: ``do_xcom_push`` stays off, as it
would add the provider's XCom sidecar to the pod).
"""

from __future__ import annotations

from typing import Any

from batch_inference.pod_outcome import run_window
from batch_inference.pod_spec import canary_command
from batch_inference.shard_pod import ShardPodOperator

RUNNERS = ("local", "kubernetes")
"""The runners this task runs the canary for."""


class CanaryPodOperator(ShardPodOperator):
    """The ``canary`` task for both runners (module docstring).

    Args:
        **kwargs: ``ShardPodOperator`` arguments (``pod_spec.canary_pod_kwargs``); ``deferrable=True``.
    """

    pod_role = "canary"

    def execute(self, context: Any) -> Any:
        """Skip, run the local canary, reuse a projection, or create the canary pod and defer.

        Returns:
            The summary (see the module docstring) unless it defers.

        Raises:
            AirflowFailException: refused (``REFUSED ...``) or bad config/input (local path).
            AirflowException: the local canary failed otherwise (retried).
            TaskDeferred: the canary pod was created (runner=kubernetes).
        """
        # parse time: these read storage (pyarrow); this module is imported when a DAG file parses
        from batch_inference.canary_task import decide, local_canary, skip_reason, skipped
        from batch_inference.planned import planned_run
        from batch_inference.projection import read_projection

        cfg, manifest, run_dir = planned_run(context)
        why = skip_reason(cfg, manifest, run_dir, RUNNERS)
        if why:
            return self._result(context, skipped(why))
        if cfg.runner == "local":
            return self._result(context, local_canary(cfg, manifest, run_dir, context))
        existing = read_projection(run_dir)
        if existing is not None:
            self.log.info("canary: projection.json exists: reusing it (no pod)")
            return self._result(context, decide(existing))
        self._set_command(cfg, run_dir, context)
        self.log.info("canary: running `batch-worker %s` in a pod", " ".join(self.arguments))
        return super().execute(context)

    def trigger_reentry(self, context: Any, event: dict[str, Any]) -> Any:
        """Handle the pod's end as a shard pod's (relaunch, fail, or succeed), then project and decide.

        Raises:
            AirflowFailException: refused, or the pod exited 2.
            AirflowException: the pod failed otherwise (retried).
            TaskDeferred: a preempted pod was replaced.
        """
        # parse time: these read storage (pyarrow); this module is imported when a DAG file parses
        from batch_contract.runstore import RunStore

        from batch_inference.canary_task import _elapsed_seconds, decide, project_canary
        from batch_inference.local_runner import machine_cores
        from batch_inference.planned import planned_run

        cfg, manifest, run_dir = planned_run(context)
        self._set_command(cfg, run_dir, context)  # a relaunch builds its pod from these
        super().trigger_reentry(context, event)
        window = run_window(self.pod, self.base_container_name)
        if window is not None:
            created, finished = window
            wall = max(0.0, (finished - created).total_seconds())
            start = getattr(context.get("dag_run"), "start_date", None)
            elapsed = max(0.0, (created - start).total_seconds()) if start is not None else 0.0
        else:
            canary = RunStore.open(run_dir).canary()
            wall = canary.elapsed_seconds if canary is not None else 0.0
            elapsed = max(0.0, _elapsed_seconds(context) - wall)
            self.log.info("canary: the pod is gone: its wall time is taken as the canary's own %.1f s", wall)
        projection = project_canary(cfg, manifest, run_dir, wall_seconds=wall, elapsed_seconds=elapsed,
                                    parallelism=1, cores=machine_cores())
        return self._result(context, decide(projection))

    def _set_command(self, cfg: Any, run_dir: str, context: Any) -> None:
        from batch_inference.canary_task import canary_options  # parse time: pyarrow (see execute)

        command = canary_command(run_dir, context["run_id"], canary_options(cfg))
        self.arguments = command["arguments"]
        self.labels = {**(self.labels or {}), **command["labels"]}

    @staticmethod
    def _result(context: Any, summary: dict[str, Any]) -> dict[str, Any]:
        context["ti"].xcom_push(key="return_value", value=summary)
        return summary


__all__ = ["RUNNERS", "CanaryPodOperator"]
