"""The storage guard of the Batch inference page: nothing outside the allowed storage roots is read, and
nothing of one run is shown as another's.

The page never takes a path from the browser: a run is named by ``(dag_id, run_id)`` and its run
directory is the ``run_dir`` XCom its ``plan`` task pushed. That value is still checked here before any
read, because anyone who can write an XCom could otherwise point the page at any file the API server can
read, or at another DAG's run:

* the run dir is absolute (a local path, ``file://`` or ``gs://``; a relative path is refused, never
  resolved against the API server's working directory) and of the run layout's form
  ``<output_root>/runs/<dag_id>/<run_id>`` (:meth:`batch_contract.layout.RunLayout.from_run_dir`);
* its ``<dag_id>`` and ``<run_id>`` segments equal the DagRun's ids, which must themselves be safe path
  segments matched whole (:func:`~batch_contract.layout.validate_dag_id`,
  :func:`~batch_contract.layout.validate_run_id`: no ``/``, no ``..``, no trailing newline);
* it lies under one of the DAG's output roots, the roots its runs may write to
  (:func:`batch_inference.policy.policy_for`: ``BATCH_INFERENCE_POLICY``, else
  ``BATCH_INFERENCE_ALLOWED_ROOTS``; local paths after ``realpath``, ``gs://`` by bucket and prefix with
  ``.``/``..`` collapsed: :func:`batch_contract.storage.is_under`);
* once read, its manifest names the same run (``run_id``) and, where it records one, the same DAG
  (``params.dag_id``): :func:`check_manifest_identity`. A run dir of the older form
  ``<output_root>/runs/<run_id>`` (planned before run dirs were namespaced by DAG id) names no DAG, so it
  is shown only when its manifest's ``params.dag_id`` is the DagRun's DAG.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from batch_contract import storage
from batch_contract.layout import SHARD_ID_PATTERN, RunLayout, validate_dag_id, validate_run_id

from batch_inference.params import POLICY_SETTING_HINT
from batch_inference.policy import policy_for


class PathRefused(PermissionError):
    """A run directory, shard id or manifest the page refuses to read or serve (the message says why; the
    API answers 403)."""


def check_run_ids(dag_id: str, run_id: str) -> None:
    """Check a DagRun's ids are safe path segments, matched whole.

    Raises:
        PathRefused: ``dag_id`` or ``run_id`` is not one (``..``, ``/``, a trailing newline, not a string).
    """
    try:
        validate_dag_id(dag_id)
        validate_run_id(run_id)
    except ValueError as exc:
        raise PathRefused(str(exc)) from None


def guarded_layout(run_dir: str, dag_id: str, run_id: str, roots: list[str] | None = None) -> RunLayout:
    """The layout of ``run_dir`` if the page may read it for the run ``(dag_id, run_id)``.

    Args:
        run_dir: ``<output_root>/runs/<dag_id>/<run_id>`` (or the older ``<output_root>/runs/<run_id>``), an
            absolute local path, ``file://`` or ``gs://`` URI.
        dag_id / run_id: the DagRun the run dir is read for (from the metadata DB, never the browser).
        roots: allowed roots (default: the DAG's output roots, ``policy_for(dag_id).output_roots``, read at
            call time).

    Returns:
        The run's :class:`~batch_contract.layout.RunLayout`.

    Raises:
        PathRefused: not a path, relative, an unknown scheme, not of the run layout's form, unsafe ids,
            ids other than ``dag_id`` / ``run_id``, outside every allowed root, or the deployment's policy
            file is unreadable.
    """
    if not isinstance(run_dir, str) or not run_dir or "\x00" in run_dir:
        raise PathRefused(f"run dir {run_dir!r} is not a path")
    check_run_ids(dag_id, run_id)
    try:
        local = storage.backend_for(run_dir).local_path(run_dir)
    except storage.StorageError as exc:
        raise PathRefused(f"run dir {run_dir!r}: {exc}") from None
    if local is not None and not local.is_absolute():
        raise PathRefused(f"run dir {run_dir!r} is relative: a run dir is an absolute path or a URI")
    try:
        layout = RunLayout.from_run_dir(run_dir)
    except ValueError as exc:
        raise PathRefused(str(exc)) from None
    if layout.run_id != run_id:
        raise PathRefused(f"run dir {run_dir!r} is of run {layout.run_id!r}, not of {run_id!r}")
    if layout.dag_id is not None and layout.dag_id != dag_id:
        raise PathRefused(f"run dir {run_dir!r} is of DAG {layout.dag_id!r}, not of {dag_id!r}")
    _check_under_roots(run_dir, layout.run_dir, dag_id, roots)
    return layout


def _check_under_roots(shown: str, uri: str, dag_id: str, roots: list[str] | None) -> None:
    """Raise :class:`PathRefused` unless ``uri`` lies under one of ``roots`` (default: ``dag_id``'s output
    roots); the message names ``shown`` and its resolved form, never the roots."""
    try:
        roots = list(policy_for(dag_id).output_roots) if roots is None else roots
        location = storage.normalize(uri)
        if any(storage.is_under(uri, root) for root in roots):
            return
    except (storage.StorageError, ValueError) as exc:  # ConfigError (a bad policy or root) is a ValueError
        raise PathRefused(f"run dir {shown!r}: {exc}") from None
    resolved = "" if location == shown else f" (resolved {location!r})"
    raise PathRefused(f"run dir {shown!r}{resolved} is outside the output roots of DAG {dag_id!r} "
                      f"({POLICY_SETTING_HINT})")


def check_manifest_identity(layout: RunLayout, dag_id: str, run_id: str, manifest_run_id: Any,
                            params: Any) -> None:
    """Check a run's manifest is the manifest of the run ``(dag_id, run_id)``.

    Args:
        layout: the run's layout (from :func:`guarded_layout`).
        dag_id / run_id: the DagRun the manifest is served for.
        manifest_run_id: the manifest's ``run_id``.
        params: the manifest's ``params`` (``plan`` records the DAG as ``params["dag_id"]``).

    Raises:
        PathRefused: the manifest's run id differs; its ``params.dag_id`` differs; or neither the run dir
            nor the manifest names a DAG (an older run dir whose manifest records none).
    """
    if manifest_run_id != run_id:
        raise PathRefused(f"the manifest in {layout.run_dir!r} is of run {manifest_run_id!r}, not of {run_id!r}")
    recorded = params.get("dag_id") if isinstance(params, Mapping) else None
    if recorded is None:
        if layout.dag_id is None:
            raise PathRefused(f"neither run dir {layout.run_dir!r} nor its manifest (params.dag_id) names the "
                              f"DAG: it is not shown as a run of {dag_id!r}")
    elif recorded != dag_id:
        raise PathRefused(f"the manifest in {layout.run_dir!r} is of DAG {recorded!r}, not of {dag_id!r}")


def guarded_manifest(data: bytes, layout: RunLayout, dag_id: str, run_id: str) -> bytes:
    """``data`` (a ``manifest.json``'s bytes) if it is the manifest of the run ``(dag_id, run_id)``.

    Raises:
        PathRefused: not a JSON object (whose run it is cannot be told), or :func:`check_manifest_identity`
            refuses it.
    """
    try:
        manifest = json.loads(data)
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict):
        raise PathRefused(f"the manifest in {layout.run_dir!r} is not a JSON object: whose run it is is unknown")
    check_manifest_identity(layout, dag_id, run_id, manifest.get("run_id"), manifest.get("params"))
    return data


def guarded_shard_id(shard_id: str) -> str:
    """``shard_id`` if it is five ASCII digits, matched whole.

    Raises:
        PathRefused: anything else (``../x``, ``00001/..``, an encoded slash, ``"00001\\n"``).
    """
    if not isinstance(shard_id, str) or not SHARD_ID_PATTERN.fullmatch(shard_id):
        raise PathRefused(f"shard id {shard_id!r} is not five digits")
    return shard_id
