"""Run alerts delivered through Airflow's notifier mechanism (:class:`~airflow.sdk.BaseNotifier`).

Two paths, one message (:class:`batch_inference.alerts.RunAlert`: the run, rows left, projected finish,
cause):

- **Deadline** (run by Airflow's triggerer): with ``BATCH_INFERENCE_DEADLINE_CALLBACK`` set where the DAG
  files are parsed, each DAG carries a :class:`~airflow.sdk.DeadlineAlert` (``dag_factory.deadline_alert``)
  whose callback is :func:`log_deadline_missed` (or your own awaitable): a run still not finished
  ``deadline_hours`` (the DAG's default) after it was queued is read from the run store and alerted.
- **Budget stop, below ``min_success_ratio``, a failed gate** (run in the task process): the completion
  gate ``wait_for_shards`` has :class:`RunAlertNotifier` as its ``on_failure_callback``.

Both log the alert as an error and, with ``BATCH_INFERENCE_ALERT_NOTIFIER`` set (a dotted path to a
callable ``factory(alert: dict) -> BaseNotifier``), send it through the notifier it returns: any of
Airflow's notifiers (Slack, SMTP, PagerDuty, ...) built with the alert's text, e.g.::

    def page(alert):
        return SlackWebhookNotifier(slack_webhook_conn_id="slack", text=alert["message"])

The triggerer awaits it (the notifier's ``async_notify``, or its ``notify`` in a thread when it has no
async form); a task calls its ``notify``. Its template fields are not rendered: the alert's text is
data (a gate's error, run ids and paths a trigger-form user chose), never a template. Imports only the standard library and ``airflow.sdk`` (loaded before any
DAG file parses) at module level, so the DAG files can reference it at parse time.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseNotifier

log = logging.getLogger(__name__)

ALERT_NOTIFIER_ENV = "BATCH_INFERENCE_ALERT_NOTIFIER"
"""Env var: dotted path (``package.module.factory``) of ``factory(alert: dict) -> BaseNotifier``; unset:
alerts are logged only."""


class AlertDeliveryError(RuntimeError):
    """``BATCH_INFERENCE_ALERT_NOTIFIER`` names nothing importable, or its factory did not return a
    notifier."""


def _factory(environ: Mapping[str, str] | None = None) -> Any | None:
    """The callable named by :data:`ALERT_NOTIFIER_ENV`, or ``None`` when unset.

    Raises:
        AlertDeliveryError: the path cannot be imported.
    """
    path = (os.environ if environ is None else environ).get(ALERT_NOTIFIER_ENV, "").strip()
    if not path:
        return None
    module, _, name = path.replace(":", ".").rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise AlertDeliveryError(f"{ALERT_NOTIFIER_ENV}={path}: cannot import it ({exc})") from exc


def _notifier_for(alert: dict[str, Any]) -> BaseNotifier | None:
    """The user's notifier for ``alert`` (:data:`ALERT_NOTIFIER_ENV`), or ``None`` when unset.

    Raises:
        AlertDeliveryError: unimportable, or the factory returned something other than a notifier.
    """
    factory = _factory()
    if factory is None:
        return None
    notifier = factory(alert)
    if not isinstance(notifier, BaseNotifier):
        raise AlertDeliveryError(f"{ALERT_NOTIFIER_ENV}: the factory returned {type(notifier).__name__}, "
                                 "not an airflow.sdk.BaseNotifier")
    return notifier


def _has_async(notifier: BaseNotifier) -> bool:
    return type(notifier).async_notify is not BaseNotifier.async_notify


def deliver(alert: Any, context: Mapping[str, Any] | None = None) -> str:
    """Log ``alert`` (a :class:`~batch_inference.alerts.RunAlert`) as an error and send it through the
    user's notifier (synchronously: task callbacks). Returns the message.

    The notifier's ``notify`` is called directly, not through ``BaseNotifier.__call__``, so its template
    fields are not rendered: an alert's text holds a gate's error, a run id and paths a trigger-form
    user chose, and a value a run gives is never a template (``batch_inference.templating``).

    Raises:
        AlertDeliveryError: see :func:`_notifier_for`; the notifier's own errors propagate.
    """
    log.error("%s", alert.message)
    notifier = _notifier_for(alert.to_dict())
    if notifier is not None:
        notifier.notify({**(context or {}), "batch_alert": alert.to_dict()})
    return alert.message


async def deliver_async(alert: Any, context: Mapping[str, Any] | None = None) -> str:
    """:func:`deliver` for the triggerer: awaits the notifier's ``async_notify``, or runs its ``notify``
    in a thread when it has no async form (templates not rendered either). Returns the message."""
    log.error("%s", alert.message)
    notifier = _notifier_for(alert.to_dict())
    if notifier is not None:
        full = {**(context or {}), "batch_alert": alert.to_dict()}
        if _has_async(notifier):
            await notifier.async_notify(full)
        else:
            await asyncio.to_thread(notifier.notify, full)
    return alert.message


FINISHED_STATES = ("success", "failed")
"""DAG run states after which a deadline alert is noise: Airflow 3.3.2 drops the deadlines of a run that
succeeded but keeps those of a failed one, whose failure the gate's notifier already sent."""


def _dag_run_fields(context: Any) -> tuple[str, dict[str, Any], str]:
    """``(run_id, conf, state)`` of the deadline callback's context: Airflow 3.3 passes the DAG run as
    the REST API's JSON (a dict); an object with attributes is read the same way."""
    dag_run = context.get("dag_run") if isinstance(context, Mapping) else None
    if dag_run is None:
        return "?", {}, ""
    if isinstance(dag_run, Mapping):
        run_id, conf, state = (dag_run.get("run_id") or dag_run.get("dag_run_id"), dag_run.get("conf"),
                               dag_run.get("state"))
    else:
        run_id, conf, state = (getattr(dag_run, "run_id", None), getattr(dag_run, "conf", None),
                               getattr(dag_run, "state", None))
    return str(run_id or "?"), dict(conf) if isinstance(conf, Mapping) else {}, str(state or "")


def _deadline_run_dir(dag_id: str, run_id: str, conf: Mapping[str, Any], default_root: str) -> tuple[str, str]:
    """``(run_dir, why not)`` of a deadline alert's run: under the run's ``conf`` ``output_root`` when
    the deployment allows it (:func:`batch_inference.locations.check_allowed_location`: a trigger-form
    user cannot point the triggerer at another store), else under the DAG's default; ``("", reason)``
    when no run dir can be formed (an unusual run id, no root)."""
    # at alert time only: this module is imported when a DAG file parses, and these pull in the
    # policy and storage modules
    from batch_contract.engine_config import ConfigError

    from batch_inference.alerts import run_dir_for
    from batch_inference.locations import check_allowed_location

    root = str(conf.get("output_root") or "")
    if root:
        try:
            check_allowed_location("output_root", root)
        except ConfigError:
            root = ""
    root = root or default_root
    if not root:
        return "", "no output_root"
    try:
        return run_dir_for(root, dag_id, run_id), ""
    except ValueError as exc:  # a run id or DAG id that is not a safe path segment
        return "", f"no run dir ({exc})"


async def log_deadline_missed(context: Any = None, **kwargs: Any) -> str:
    """Default deadline callback: read the run from the store and :func:`deliver_async` a
    ``deadline_missed`` alert (run, rows left, projected finish).

    Args:
        context: what Airflow passes to deadline callbacks (``{"dag_run": {...}, "deadline": {...}}``;
            may be ``None``).
        kwargs: the callback kwargs the DAG declared: ``dag_id``, ``deadline_hours`` and ``output_root``
            (the DAG's default; a run's ``conf`` value wins).

    Returns:
        The message delivered; ``""`` (nothing delivered) for a run that had already finished when the
        deadline was handled (:data:`FINISHED_STATES`).
    """
    from batch_inference.alerts import AlertKind, describe_run  # pyarrow: at alert time only

    dag_id = str(kwargs.get("dag_id") or "?")
    hours = kwargs.get("deadline_hours", "?")
    run_id, conf, state = _dag_run_fields(context)
    if state.rsplit(".", 1)[-1].lower() in FINISHED_STATES:
        log.info("DAG %s run %s had already ended (%s) when its %s h deadline passed: no alert", dag_id, run_id,
                 state, hours)
        return ""
    run_dir, why = _deadline_run_dir(dag_id, run_id, conf, str(kwargs.get("output_root") or ""))
    detail = (f"Not finished {hours} h after it was queued: check wait_for_shards (missing shards, progress "
              f"line) and publish.{f' ({why})' if why else ''}")
    alert = await asyncio.to_thread(describe_run, AlertKind.DEADLINE_MISSED, dag_id, run_id, run_dir, detail)
    return await deliver_async(alert, context if isinstance(context, Mapping) else None)


class RunAlertNotifier(BaseNotifier):
    """``on_failure_callback`` of the completion gate: a budget stop, a run below ``min_success_ratio``
    or a gate that failed before waiting becomes a :class:`~batch_inference.alerts.RunAlert`
    (:func:`~batch_inference.alerts.classify_gate_failure` on the task's exception), delivered by
    :func:`deliver`. The run dir is the plan task's XCom ``run_dir``."""

    def notify(self, context: Any) -> None:
        from batch_inference.alerts import classify_gate_failure, describe_run  # pyarrow: at alert time only

        error = str(context.get("exception") or "")
        dag_run = context.get("dag_run")
        run_id = str(getattr(dag_run, "run_id", None) or "?")
        dag_id = str(getattr(dag_run, "dag_id", None) or getattr(context.get("dag"), "dag_id", None) or "?")
        run_dir = ""
        try:  # the alert goes out even when the run dir cannot be read back (API server down)
            ti = context.get("ti")
            run_dir = str(ti.xcom_pull(task_ids="plan", key="run_dir") or "") if ti is not None else ""
        except Exception as exc:  # noqa: BLE001 - any failure of the lookup: alert without the figures
            log.warning("alert for %s %s: the plan task's run_dir could not be read: %s", dag_id, run_id, exc)
        deliver(describe_run(classify_gate_failure(error), dag_id, run_id, run_dir, error), context)


__all__ = ["ALERT_NOTIFIER_ENV", "AlertDeliveryError", "RunAlertNotifier", "deliver", "deliver_async",
           "log_deadline_missed"]
