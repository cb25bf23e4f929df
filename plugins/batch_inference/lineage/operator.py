"""``@lineage_task(role)``: a TaskFlow ``@task`` whose run reports its datasets and the model to
OpenLineage, through the mechanism the OpenLineage provider documents for operators a project owns: the
``get_openlineage_facets_on_start`` / ``_on_complete`` / ``_on_failure`` methods, which the provider's
listener calls (its ``DefaultExtractor``) when the task starts, succeeds and fails.

The provider calls those methods in a child process it forks (or a thread, ``[openlineage]
execute_in_thread``) with nothing but the operator and, at the end, the task instance; a call from there
to the Airflow supervisor (an XCom read, a connection lookup) can hang until the provider's timeout
(10 s) kills the child, and ``dag.test()`` / ``airflow dags test`` always hang there. So the lineage is
collected in the task's own process, into the operator object the listener then reads:

* START: when the task's templates are rendered (:meth:`LineageTaskOperator.render_template_fields`,
  which Airflow calls with the run's context just before it notifies the listener of the start);
* COMPLETE: right after the task body returns (:meth:`LineageTaskOperator.execute`);
* FAIL: what START collected.

What is collected is :mod:`batch_inference.lineage.collect`; the OpenLineage objects are built by
:mod:`batch_inference.lineage.facets`, imported only inside those methods.

Cheap when there is no lineage to report: nothing is collected unless the OpenLineage provider is
installed and enabled (:func:`lineage_enabled`: a transport or config is set and ``[openlineage]
disabled`` is not true). This module imports only what every ``@task`` already loads, so a DAG file
using it parses at the cost of one using ``@task``. Collecting never fails a task: an error is logged
and that event goes out without this task's datasets.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow.providers.standard.decorators.python import _PythonDecoratedOperator
from airflow.sdk.bases.decorator import task_decorator_factory

log = logging.getLogger(__name__)

ROLES = ("plan", "publish")
"""The tasks that report lineage (:mod:`batch_inference.lineage.collect` has a START and COMPLETE
collector for each)."""


def lineage_enabled() -> bool:
    """Whether OpenLineage events will be emitted from this process: the provider is installed and its
    configuration does not disable it (``[openlineage] disabled``, or no transport / config at all)."""
    try:
        from airflow.providers.openlineage import conf
    except ImportError:
        return False
    return not conf.is_disabled()


class LineageTaskOperator(_PythonDecoratedOperator):
    """The operator of ``@task`` (``_PythonDecoratedOperator``: same arguments, templates and XCom) that
    reports OpenLineage lineage for the task ``lineage_role`` names.

    Args:
        lineage_role: ``plan`` or ``publish`` (which collector of :mod:`batch_inference.lineage.collect`).
        model_from_asset: the DAG takes its model from the triggering Asset event (its ``model_version``
            is reported).
        **kwargs: everything ``@task`` accepts.

    Raises:
        ValueError: ``lineage_role`` is not one of :data:`ROLES`.
    """

    custom_operator_name = "@task"

    def __init__(self, *, lineage_role: str, model_from_asset: bool = False, **kwargs: Any) -> None:
        if lineage_role not in ROLES:
            raise ValueError(f"lineage_role: {lineage_role!r} is not one of {', '.join(ROLES)}")
        super().__init__(**kwargs)
        self.lineage_role = lineage_role
        self.model_from_asset = model_from_asset
        self._lineage_start: Any = None
        self._lineage_complete: Any = None

    def _collect(self, event: str, context: Mapping[str, Any], *args: Any) -> Any:
        """The :class:`~batch_inference.lineage.collect.TaskLineage` of ``event`` (``start`` or ``complete``),
        or ``None`` when OpenLineage is off or collecting failed (logged)."""
        if not lineage_enabled():
            return None
        from batch_inference.lineage import collect  # run time only: the planner and publish modules

        try:
            return getattr(collect, f"{self.lineage_role}_{event}")(context, *args,
                                                                  model_from_asset=self.model_from_asset)
        except Exception as exc:  # lineage must never fail the task: the event goes out without datasets
            log.warning("OpenLineage: no lineage for the %s of task %s: %s: %s", event.upper(), self.task_id,
                        type(exc).__name__, exc)
            return None

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """Render the templates (as ``@task``), then collect the START lineage with the run's context."""
        super().render_template_fields(context, jinja_env)
        self._lineage_start = self._collect("start", context)

    def execute(self, context: Any) -> Any:
        """Run the task body (as ``@task``), then collect the COMPLETE lineage from its result."""
        result = super().execute(context)
        if self.lineage_role == "publish":
            self._lineage_complete = self._collect("complete", context, result)
        else:
            self._lineage_complete = self._collect("complete", context)
        return result

    @staticmethod
    def _operator_lineage(lineage: Any) -> Any:
        from airflow.providers.openlineage.extractors import OperatorLineage

        if lineage is None:
            return OperatorLineage()
        from batch_inference.lineage.facets import operator_lineage  # the OpenLineage client: listener only

        return operator_lineage(lineage)

    def get_openlineage_facets_on_start(self) -> Any:
        """The START lineage (called by the OpenLineage provider's listener)."""
        return self._operator_lineage(self._lineage_start)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The COMPLETE lineage (called by the listener), or START's if the body's result gave none."""
        return self._operator_lineage(self._lineage_complete or self._lineage_start)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """The FAIL lineage (called by the listener): what START collected."""
        return self._operator_lineage(self._lineage_start)


def lineage_task(lineage_role: str, *, model_from_asset: bool = False, multiple_outputs: bool | None = None,
                 **kwargs: Any) -> Any:
    """``@task`` with OpenLineage lineage: ``@lineage_task("publish", outlets=[alias])`` over a function.

    Args:
        lineage_role / model_from_asset: see :class:`LineageTaskOperator`.
        multiple_outputs / **kwargs: as ``@task``.

    Raises:
        ValueError: an unknown ``lineage_role`` (when the task is created).
    """
    return task_decorator_factory(multiple_outputs=multiple_outputs, decorated_operator_class=LineageTaskOperator,
                                  lineage_role=lineage_role, model_from_asset=model_from_asset, **kwargs)


__all__ = ["ROLES", "LineageTaskOperator", "lineage_enabled", "lineage_task"]
