"""The shard pod task: a deferrable ``KubernetesPodOperator`` that knows the worker's exit codes.

:class:`ShardPodOperator` keeps the provider's whole lifecycle (create, defer to
``KubernetesPodTrigger``, stream logs, ``durable`` reattach, ``on_kill``) and changes only what a
finished pod means (:func:`batch_inference.pod_outcome.classify`):

* **preempted** (exit 75, pod vanished, node reclaimed, exit status lost by the kubelet): the old pod's log is copied into the task log,
  the pod is deleted, and a fresh pod for the same shard is created and deferred on, inside the same
  try: Airflow's ``retries`` are not consumed and ``try_number`` does not change. The worker in the new
  pod resumes from the committed part files. The count rides on the pod
  (annotation :data:`~batch_inference.pod_outcome.PREEMPTIONS_ANNOTATION`) and in the trigger's
  kwargs, so it survives a triggerer restart and a reattach; past ``max_preemptions`` in one try the
  try fails like a crash (and the normal retries apply).
  A pod that ends as preempted after its shard's marker is complete is deleted and the task succeeds.
* **already complete**: a try whose shard has its complete marker (``RunStore.is_complete``) creates no
  pod and succeeds (a try reset by a restarted scheduler after its pod finished; a cleared task), as
  the local runner starts no worker for a complete shard; a pod an earlier run of the task left is
  deleted. As there, the marker's fingerprint is not compared: model files replaced under the same run
  are not picked up by clearing the task (the worker would redo the shard; publish refuses mixed
  fingerprints): start a new run.
* **bad input** (exit 2): ``AirflowFailException``: the task fails now, no retries, one pod.
* **unschedulable** (still unbound when ``startup_timeout_seconds`` ran out): the pod is deleted and
  the try fails with the ``PodScheduled`` condition's reason and message.
* anything else failing (exit 1, OOM kill, a start timeout after scheduling): the provider's
  ``AirflowException``, so the normal ``retries`` with exponential backoff apply.

**Quota**: a pod create the namespace's ResourceQuota refuses (403 ``exceeded quota``; Kubernetes does not
queue such a pod) waits with backoff and tries again within the try for up to ``quota_wait_seconds``
(:mod:`batch_inference.quota`), holding the task's worker slot meanwhile; only then does the try fail.

**Budget stop**: before a try creates a shard's pod, :meth:`ShardPodOperator.execute` prices what the run
has spent so far (``budget.over_budget_message``: the complete shards' markers and the canary); past
``budget_usd`` by ``budget.BUDGET_TOLERANCE`` the try fails with ``AirflowFailException``
(``BUDGET EXCEEDED: ...``, no retry) and no pod is created. A preempted pod's replacement within a try is
not checked (its shard has already started), nor is a pod a retry reattaches to.

Pods are never left behind by this task: succeeded and preempted pods are deleted, stuck ones are
deleted at the timeout, and killing or clearing the task deletes the running pod (the provider's
``on_kill``; while deferred, ``KubernetesPodTrigger.on_kill``, which the Airflow 3.3 triggerer calls
when a user clears the task or marks it failed or succeeded, and not when the triggerer restarts). Failed pods (exit 1 and 2) are kept, marked
``already_checked``, for ``kubectl logs`` (``on_finish_action="delete_succeeded_pod"``).

**Offline**: :func:`build_pod` builds the exact pod this operator would submit for a shard
(``build_pod_request_obj(dry_run=True)``), and :func:`render_pod_manifests` writes it as YAML
(``PodGenerator.serialize_pod``), with no cluster: the dry run's ``render_k8s`` task and
``python -m batch_inference.cli`` use them. The kwargs themselves come from :mod:`batch_inference.pod_spec`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from airflow.providers.cncf.kubernetes.operators.pod import KubernetesPodOperator
from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from batch_contract.engine_config import WorkerSettings
from kubernetes.client.exceptions import ApiException

from batch_inference.pod_outcome import (
    PREEMPTIONS_ANNOTATION,
    PREEMPTIONS_EVENT_KEY,
    PodOutcome,
    classify,
    exit_code,
    oom_failure,
    preemption_cause,
    preemptions_of,
    scheduling_failure,
    start_failure,
)
from batch_inference.pod_spec import (
    K8sSettings,
    kpo_expand_kwargs,
    kpo_partial_kwargs,
    label_value,
    shard_of,
    with_preprocess_cpus,
)
from batch_inference.quota import create_with_quota_backoff

DEFAULT_MAX_PREEMPTIONS = 20
"""Preempted pods one try may replace before it fails (issue 14: spot deaths are expected)."""


class ShardPodOperator(KubernetesPodOperator):
    """``KubernetesPodOperator`` for one shard's worker pod (semantics in the module docstring).

    Args:
        max_preemptions: preempted pods one try replaces without consuming a retry (>= 0).
        **kwargs: ``KubernetesPodOperator`` arguments (``pod_spec.kpo_partial_kwargs`` /
            ``kpo_expand_kwargs``); must be ``deferrable=True`` for the relaunch path.

    Raises:
        ValueError: ``max_preemptions`` is negative.
    """

    pod_role = "shard"
    """What the pod is, in log and failure messages (``canary_pod.CanaryPodOperator``: ``canary``)."""

    def __init__(self, *, max_preemptions: int = DEFAULT_MAX_PREEMPTIONS, quota_wait_seconds: int = 0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if max_preemptions < 0:
            raise ValueError(f"max_preemptions: {max_preemptions} must be >= 0")
        if quota_wait_seconds < 0:
            raise ValueError(f"quota_wait_seconds: {quota_wait_seconds} must be >= 0")
        self.max_preemptions = max_preemptions
        self.quota_wait_seconds = quota_wait_seconds
        self.preemptions = 0

    # -- the in-run budget stop ---------------------------------------------------------------------
    def execute(self, context: Any) -> Any:
        """Return at once when the shard is already complete (:meth:`shard_complete`: no pod), fail without
        creating a pod when the run is over its budget (module docstring), else run the provider's
        ``execute`` (create or reattach the pod and defer).

        Raises:
            AirflowFailException: ``BUDGET EXCEEDED: ...`` (``budget.over_budget_message``).
            StorageError / OSError: the shard's marker could not be read (other than not found); the try
                fails and the normal retries apply.
        """
        if self.shard_complete():
            self.log.info("shard already complete (its marker is in storage): no %s pod created", self.pod_role)
            self._delete_leftover_pod(context)
            return None
        message = self.over_budget()
        if message:
            raise AirflowFailException(message)
        return super().execute(context)

    def shard_complete(self) -> bool:
        """Whether this task's shard already has its complete marker (``RunStore.is_complete``, the
        contract's one shard-state rule); ``False`` for a command that is not a shard's. A try that runs
        again after its pod finished (a task reset by a restarted scheduler, a cleared task, a pod that
        vanished after committing everything) then creates no pod, as the local runner starts no worker.

        Raises:
            StorageError / OSError: the marker could not be read (other than not found).
        """
        shard = shard_of(self.arguments)
        if shard is None:
            return False
        from batch_contract.runstore import RunStore  # parse time: see over_budget

        run_dir, shard_id = shard
        return RunStore.open(run_dir).is_complete(shard_id)

    def _delete_leftover_pod(self, context: Any) -> None:
        """Delete the pod an earlier run of this task left (the provider's reattach lookup: the pod name
        in the task state store, else the task's labels whatever the try), whose shard is complete now: a
        pod that finished while its task was reset, or that a stealing worker's marker made idle. Its
        log goes to the task log first."""
        if not self.reattach_on_restart:
            return
        pod = self._get_pod_from_task_state_store(context) or self.find_pod(self.namespace, context=context)
        if pod is not None:
            self.log.info("deleting %s pod %s left by an earlier run of this task", self.pod_role, pod.metadata.name)
            self._retire(pod)

    def _complete_before_relaunch(self) -> bool:
        """:meth:`shard_complete` for a preempted pod; a marker that cannot be read now counts as not
        complete (logged): the relaunched worker reads it itself and exits 0 at once when it is complete,
        so a storage hiccup costs a pod, not a retry."""
        from batch_contract.storage import StorageError  # parse time: the storage package imports pyarrow

        try:
            return self.shard_complete()
        except (StorageError, OSError) as exc:
            self.log.warning("could not read the shard's marker (%r): relaunching", exc)
            return False

    def over_budget(self) -> str | None:
        """The ``BUDGET EXCEEDED`` message when this task's shard must not start, else ``None`` (also for a
        command that is not a shard's, e.g. the canary's). Reads the run's manifest and markers."""
        shard = shard_of(self.arguments)
        if shard is None:
            return None
        # parse time: the run store imports pyarrow; this module is imported when a DAG file parses
        from batch_inference.budget import over_budget_message
        from batch_inference.planned import manifest_for, run_config_of

        run_dir, shard_id = shard
        return over_budget_message(run_dir, run_config_of(manifest_for(run_dir)), shard_id)

    # -- the pod carries the preemption count ------------------------------------------------------
    def build_pod_request_obj(self, context: Any = None, *, dry_run: bool = False):
        """The provider's pod plus the :data:`PREEMPTIONS_ANNOTATION` of this try so far, with the CPUs a
        document extraction pool needs (:func:`~batch_inference.pod_spec.with_preprocess_cpus`)."""
        pod = with_preprocess_cpus(super().build_pod_request_obj(context, dry_run=dry_run))
        pod.metadata.annotations = {**(pod.metadata.annotations or {}),
                                    PREEMPTIONS_ANNOTATION: str(self.preemptions)}
        return pod

    def get_or_create_pod(self, pod_request_obj, context):
        """The provider's create-or-reattach, tried again while a ResourceQuota refuses the create
        (:func:`~batch_inference.quota.create_with_quota_backoff`; each try looks for the pod first, so a
        create whose reply was lost is reattached, not doubled); a reattached pod brings back its
        preemption count."""
        pod = create_with_quota_backoff(lambda: super(ShardPodOperator, self).get_or_create_pod(
            pod_request_obj, context), self.quota_wait_seconds, what=f"{self.pod_role} pod")
        self.preemptions = preemptions_of(pod)
        return pod

    def invoke_defer_method(self, last_log_time=None, context=None) -> None:
        """Defer as the provider does, with the preemption count in the trigger's kwargs."""
        self.trigger_kwargs = {**(self.trigger_kwargs or {}), PREEMPTIONS_EVENT_KEY: self.preemptions}
        super().invoke_defer_method(last_log_time=last_log_time, context=context)

    # -- what a finished pod means -----------------------------------------------------------------
    def trigger_reentry(self, context: Any, event: dict[str, Any]) -> Any:
        """Act on the trigger's event (module docstring); raises ``TaskDeferred`` when it relaunches."""
        self.preemptions = preemptions_of(None, event)
        pod = self._read_pod(event)
        outcome = classify(event["status"], pod, self.base_container_name)
        self.log.info("%s pod %s: trigger status %s, exit code %s -> %s", self.pod_role, event.get("name"),
                      event["status"], exit_code(pod, self.base_container_name) if pod else None,
                      outcome.value)
        if outcome is PodOutcome.PREEMPTED:
            if not self._complete_before_relaunch():
                return self._relaunch(context, pod)
            self.log.info("%s pod %s ended as preempted (%s) after its shard completed: not relaunched",
                          self.pod_role, event.get("name"), preemption_cause(pod, self.base_container_name))
            if pod is not None:
                self._retire(pod)
            return None
        if outcome is PodOutcome.OUT_OF_MEMORY:
            self._copy_logs(pod)
            raise AirflowFailException(oom_failure(pod, self.base_container_name, self.pod_role))
        if event["status"] == "timeout":
            self._fail_timeout(pod, outcome, event)
        if outcome is PodOutcome.SUCCEEDED and pod is None:
            return None  # the pod was garbage-collected after the trigger saw it succeed
        try:
            return super().trigger_reentry(context, event)
        except AirflowException as exc:
            if outcome is PodOutcome.BAD_INPUT and not isinstance(exc, AirflowFailException):
                raise AirflowFailException(
                    f"{self.pod_role} pod {event.get('name')} exited 2 (bad config or input; the worker's log above "
                    f"names the field): failing without retries. {exc}") from exc
            raise

    def _read_pod(self, event: dict[str, Any]):
        try:
            return self.hook.get_pod(event["name"], event["namespace"])
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _relaunch(self, context: Any, old_pod: Any) -> None:
        """Replace a preempted pod within this try, or fail the try past ``max_preemptions``."""
        cause = preemption_cause(old_pod, self.base_container_name)
        count = self.preemptions + 1
        ti = context["ti"]
        if old_pod is not None:
            self._retire(old_pod)
        if count > self.max_preemptions:
            raise AirflowException(
                f"{self.pod_role} pod preempted {count} times in try {ti.try_number} (max_preemptions="
                f"{self.max_preemptions}); last: {cause}. Failing this try; Airflow retries apply.")
        self.preemptions = count
        self.log.warning("%s pod %s preempted: %s. Relaunching preemption %d/%d in the same try "
                         "(try_number %s, no retry consumed)", self.pod_role,
                         old_pod.metadata.name if old_pod else "?",
                         cause, count, self.max_preemptions, ti.try_number)
        self.pod_request_obj = self.build_pod_request_obj(context)
        create_with_quota_backoff(lambda: self.pod_manager.create_pod(pod=self.pod_request_obj),
                                  self.quota_wait_seconds, what=f"{self.pod_role} pod")
        self.pod = self.pod_request_obj
        self._persist_pod_identity_to_task_state_store(context, self.pod)
        self.invoke_defer_method(context=context)

    def _retire(self, pod: Any) -> None:
        """Copy ``pod``'s log into the task log, then delete the pod."""
        self._copy_logs(pod)
        self.pod_manager.delete_pod(pod)

    def _copy_logs(self, pod: Any) -> None:
        if not self.get_logs:
            return
        try:
            self._write_logs(pod)
        except Exception as exc:  # logs are a courtesy here; the relaunch must go on
            self.log.warning("could not read the log of preempted pod %s: %r", pod.metadata.name, exc)

    def _fail_timeout(self, pod: Any, outcome: PodOutcome, event: dict[str, Any]) -> None:
        """Delete the pod of a timed-out try and fail the try naming why (``AirflowException``: the
        retries apply): the ``PodScheduled`` reason when it was never scheduled, the container's waiting
        reason when it was scheduled but did not start, else the trigger's message (execution timeout)."""
        timeout = float(self.startup_timeout_seconds)
        if pod is None:
            raise AirflowException(f"{self.pod_role} pod {event.get('name')} timed out and is gone: {event.get('message')}")
        if outcome is PodOutcome.UNSCHEDULABLE:
            message = scheduling_failure(pod, timeout, self.pod_role)
        elif pod.status is not None and pod.status.phase == "Pending":
            message = start_failure(pod, self.base_container_name, timeout, self.pod_role)
        else:
            message = f"{self.pod_role} pod {pod.metadata.name}: {event.get('message')}"
        self.log.error("%s; deleting the pod", message)
        self.pod_manager.delete_pod(pod)
        raise AirflowException(message)


# -- the pod, built offline ------------------------------------------------------------------------
def build_pod(ref: dict[str, Any], run_id: str, settings: K8sSettings, worker: WorkerSettings | None = None):
    """The ``V1Pod`` the provider would create for one shard, built offline (no cluster, no context).

    Raises:
        ConfigError: grace period too short (:func:`~batch_inference.pod_spec.kpo_partial_kwargs`).
    """
    kwargs = {**kpo_partial_kwargs(settings, worker), **kpo_expand_kwargs(ref, run_id)}
    kwargs["name"] = f"batch-worker-{ref['shard_id']}"
    op = ShardPodOperator(task_id=f"infer_k8s_{ref['shard_id']}", **kwargs)
    return op.build_pod_request_obj(None, dry_run=True)


def render_pod_manifests(refs: list[dict[str, Any]], run_id: str, settings: K8sSettings, out_dir: str,
                         worker: WorkerSettings | None = None) -> list[str]:
    """Write one pod manifest per shard to ``out_dir/<run label>-<shard_id>.yaml``.

    Returns:
        The written file paths, in shard order.

    Raises:
        ConfigError: grace period too short (:func:`~batch_inference.pod_spec.kpo_partial_kwargs`).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for ref in refs:
        manifest = PodGenerator.serialize_pod(build_pod(ref, run_id, settings, worker))
        path = out / f"{label_value(run_id)}-{ref['shard_id']}.yaml"
        path.write_text(yaml.safe_dump(manifest, sort_keys=False))
        paths.append(str(path))
    return paths
