"""``python -m batch_worker run --run-dir URI --shard ID`` (:func:`batch_worker.cli.entry`)."""

from __future__ import annotations

from batch_worker.cli import entry

entry()
