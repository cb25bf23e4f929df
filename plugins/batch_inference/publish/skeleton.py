"""The one publish skeleton and the one rollback skeleton every backend runs (see :mod:`.backend`)."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

from batch_inference.publish.backend import PublishBackend, check_owned
from batch_inference.publish.coverage import Coverage, check_coverage
from batch_inference.publish.errors import PublishError
from batch_inference.publish.files import localize
from batch_inference.publish.inventory import RunInventory
from batch_inference.publish.record import PublishRecord
from batch_inference.publish.stages import StageClock
from batch_inference.publish.target import SUFFIX_PREVIOUS


def run_publish(
    backend: PublishBackend,
    inv: RunInventory,
    *,
    min_success_ratio: float,
    make_record: Callable[[Coverage], PublishRecord],
    after_staging: Callable[[], None] | None = None,
    stages: dict[str, float] | None = None,
) -> tuple[PublishRecord, bool]:
    """Ownership check, no-op check, coverage, staging, ``after_staging``, swap + log, in that order.

    Args:
        backend: a not yet entered backend for the target.
        inv: the verified run inventory (:func:`~batch_inference.publish.inventory.load_inventory`).
        min_success_ratio: see :func:`~batch_inference.publish.coverage.check_coverage`.
        make_record: builds the record stored with the published data from the coverage counts.
        after_staging: called after staging is written, before the swap (crash tests).
        stages: if given, filled with wall seconds per step (``coverage``, ``load``, ``swap``).

    Returns:
        ``(record, noop)``: the live record; ``noop`` when the run was already live.

    Raises:
        ForeignTableError: a table of the target exists that publish did not create (checked before
            anything is written; the backends check again before each drop and rename).
        PublishError / CoverageError: see :func:`~batch_inference.publish.api.publish_run`.
    """
    with backend as b:
        check_owned(b)
        live = b.read_record()
        if live and live.matches(inv.run_id, inv.fingerprint, inv.files_digest):
            return live, True
        clock = StageClock(stages)
        with tempfile.TemporaryDirectory(prefix="publish-") as work:
            parts = localize(inv.part_files, Path(work) / "parts")
            dead = localize(inv.dead_letter_files, Path(work) / "dead")
            with b.coverage_db(Path(work)) as con:
                cov = check_coverage(con, inv, parts, dead, min_success_ratio=min_success_ratio)
                clock.lap("coverage")
                record = make_record(cov)
                b.load_staging(con, cov, record)
                clock.lap("load")
        if after_staging is not None:
            after_staging()
        b.swap(record)
        clock.lap("swap")
        return record, False


def run_rollback(backend: PublishBackend) -> tuple[PublishRecord | None, PublishRecord | None]:
    """Restore the rollback target (the data the last publish replaced) as live, in one commit.

    Returns:
        ``(restored, replaced)`` records (``None`` for data publish did not write).

    Raises:
        ForeignTableError: a table of the target exists that publish did not create (nothing changed).
        PublishError: there is nothing to roll back to.
    """
    with backend as b:
        check_owned(b)
        if not b.has_previous():
            raise PublishError(f"{b.target.describe()}: no {b.target.name(SUFFIX_PREVIOUS)} to roll back to")
        restored, replaced = b.read_record(previous=True), b.read_record()
        b.restore_previous(restored)
        return restored, replaced
