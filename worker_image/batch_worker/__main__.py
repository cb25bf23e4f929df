"""``python -m batch_worker run --run-dir URI --shard ID`` and the ``batch-worker`` console script (:func:`run`)."""

from __future__ import annotations

from typing import NoReturn

from batch_worker.signals import DEFAULT_GRACE_SECONDS, StopSignal, leave


def run(argv: list[str] | None = None) -> NoReturn:
    """The process entry: install the SIGTERM/SIGINT handler first (before torch, pyarrow or the CLI are
    imported), run :func:`batch_worker.cli.main` with it, and end the process with its exit code through
    :func:`batch_worker.signals.leave` (``os._exit`` after a signal)."""
    stop = StopSignal(DEFAULT_GRACE_SECONDS).install()
    from batch_worker.cli import main

    leave(main(argv, stop=stop), stop)


if __name__ == "__main__":
    run()
