"""SIGTERM/SIGINT handling: stop taking batches, commit within the grace period, exit 75.

First signal: :attr:`StopSignal.requested` becomes true (the runtime stops taking batches, commits the
rows already finished and exits with ``ExitCode.INTERRUPTED``) and a watchdog starts: if the worker has not
exited ``grace_seconds`` later, the in-flight work is abandoned with ``os._exit(75)``. Second signal: exit
75 at once. Either hard exit leaves no visible partial file, because commits are create-only (temp name
+ link); stray temp files are cleaned by the next attempt.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable

from batch_contract.enums import ExitCode

log = logging.getLogger(__name__)


class StopSignal:
    """Installs the handlers (main thread only) and exposes the stop request.

    Args:
        grace_seconds: seconds between the first signal and the hard exit.
        on_hard_exit: called (best effort, must be quick) just before a hard exit, e.g. to rewrite the
            attempt record.
    """

    def __init__(self, grace_seconds: float, on_hard_exit: Callable[[str], None] | None = None) -> None:
        self.grace_seconds = grace_seconds
        self.on_hard_exit = on_hard_exit
        self._event = threading.Event()
        self.signal_name: str | None = None
        self.received_at: float | None = None
        self._previous: dict[int, object] = {}
        self._timer: threading.Timer | None = None

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def __call__(self) -> bool:
        return self._event.is_set()

    def install(self) -> StopSignal:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        """Restore the previous handlers and cancel a pending grace-period watchdog."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if self._event.is_set():
            self._hard_exit(f"second signal {name}")
            return
        self.signal_name = name
        self.received_at = time.monotonic()
        self._event.set()
        log.warning("%s received: finishing the in-flight batch, committing, exiting %d within %.0f s",
                    name, int(ExitCode.INTERRUPTED), self.grace_seconds)
        # leave a second (or 10 %) of the grace for the exit itself
        timer = threading.Timer(max(self.grace_seconds - 1.0, 0.9 * self.grace_seconds), self._hard_exit, args=("grace period over",))
        timer.daemon = True
        timer.start()
        self._timer = timer

    def _hard_exit(self, why: str) -> None:
        log.error("%s: abandoning in-flight work, exiting %d now", why, int(ExitCode.INTERRUPTED))
        if self.on_hard_exit is not None:
            try:
                self.on_hard_exit(why)
            except Exception:  # best effort only: never delay the exit
                pass
        logging.shutdown()
        os._exit(int(ExitCode.INTERRUPTED))
