"""The storage guard of the Batch inference page: nothing outside the allowed storage roots is read.

The page never takes a path from the browser: a run is named by ``(dag_id, run_id)`` and its run
directory is the ``run_dir`` XCom its ``plan`` task pushed. That value is still checked here before any
read, because anyone who can write an XCom could otherwise point the page at any file the API server can
read. The check is the DAG Params' (:func:`batch_inference.params.check_allowed_location`: local paths
after ``realpath``, ``gs://`` by bucket and prefix with ``.``/``..`` collapsed) against the same allow-list
(``BATCH_INFERENCE_ALLOWED_ROOTS``, :func:`batch_inference.params.allowed_roots`), plus the run layout's
own rules (``<output_root>/runs/<run_id>`` with a safe run id, five-digit shard ids).
"""

from __future__ import annotations

from batch_contract.engine_config import ConfigError
from batch_contract.layout import SHARD_ID_PATTERN, RunLayout

from batch_inference.params import check_allowed_location


class PathRefused(PermissionError):
    """A run directory or shard id the page refuses to read (the message says why; the API answers 403)."""


def guarded_layout(run_dir: str, roots: list[str] | None = None) -> RunLayout:
    """The layout of ``run_dir`` if it may be read.

    Args:
        run_dir: ``<output_root>/runs/<run_id>`` (local path, ``file://`` or ``gs://``).
        roots: allowed roots (default :func:`batch_inference.params.allowed_roots`, read at call time).

    Returns:
        The run's :class:`~batch_contract.layout.RunLayout`.

    Raises:
        PathRefused: not of the form ``<output_root>/runs/<run_id>``, an unsafe run id (``..``, ``/``),
            an unknown scheme, or outside every allowed root.
    """
    if not isinstance(run_dir, str) or not run_dir or "\x00" in run_dir:
        raise PathRefused(f"run dir {run_dir!r} is not a path")
    try:
        layout = RunLayout.from_run_dir(run_dir)
        check_allowed_location("run_dir", layout.run_dir, roots)
    except (ValueError, ConfigError) as exc:
        raise PathRefused(str(exc)) from None
    return layout


def guarded_shard_id(shard_id: str) -> str:
    """``shard_id`` if it is five digits.

    Raises:
        PathRefused: anything else (``../x``, ``00001/..``, an encoded slash).
    """
    if not isinstance(shard_id, str) or not SHARD_ID_PATTERN.match(shard_id):
        raise PathRefused(f"shard id {shard_id!r} is not five digits")
    return shard_id
