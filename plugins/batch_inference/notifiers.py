"""Deadline-alert callbacks of the batch-inference DAGs (run by Airflow's triggerer).

With ``BATCH_INFERENCE_DEADLINE_CALLBACK`` set where the DAG files are parsed (a dotted path to an
awaitable), each DAG carries a :class:`~airflow.sdk.DeadlineAlert` (see ``dag_factory.deadline_alert``):
when a run is still not finished ``deadline_hours`` (the DAG's default) after it was queued, Airflow's
triggerer calls it. ``batch_inference.notifiers.log_deadline_missed`` logs an error; point the variable
at your own notifier instead, e.g. a module on the triggerer's ``PYTHONPATH`` with::

    async def page_on_call(context=None, **kwargs):
        await SlackWebhookNotifier(slack_webhook_conn_id="slack", text=...).async_notify(context)

Imports nothing beyond the standard library, so the DAG files can reference it at parse time.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


async def log_deadline_missed(context: Any = None, **kwargs: Any) -> str:
    """Default deadline callback: log an error naming the DAG, the deadline and what to check.

    Args:
        context: the Airflow context Airflow passes to deadline callbacks (may be ``None``).
        kwargs: the callback kwargs the DAG declared (``dag_id``, ``deadline_hours``).

    Returns:
        The message logged (handy in tests).
    """
    dag_id = kwargs.get("dag_id", "?")
    hours = kwargs.get("deadline_hours", "?")
    run = ""
    if isinstance(context, dict) and context.get("dag_run") is not None:
        run = f" run {getattr(context['dag_run'], 'run_id', context['dag_run'])}"
    message = (f"batch inference deadline missed: DAG {dag_id}{run} is not finished {hours} h after it was "
               "queued. Check wait_for_shards (missing shards, progress line) and publish; set "
               "BATCH_INFERENCE_DEADLINE_CALLBACK to route this alert to your pager.")
    log.error("%s", message)
    return message
