"""SIGTERM/SIGINT handling: stop taking batches, commit within the grace period, exit 75.

The process entry (:func:`batch_worker.__main__.run`, also the ``batch-worker`` console script) installs
one :class:`StopSignal` before it imports anything heavy, and keeps it installed until the process is
gone, so a signal at any moment after that (start-up, model load, a batch, a commit, the exit itself) is
handled; as a container's PID 1 the worker would otherwise ignore SIGTERM (the kernel drops signals PID 1
has no handler for). Only the interpreter's own start-up, before the entry runs, is left uncovered.

First signal: :attr:`StopSignal.requested` becomes true (the runtime stops taking batches, commits the
rows already finished and returns ``ExitCode.INTERRUPTED``) and a watchdog starts: if the worker has not
exited ``grace_seconds`` later (less one second, or 10 %), the in-flight work is abandoned with
``os._exit(75)``. Second signal: exit 75 at once. Either hard exit leaves no visible partial file, because
commits are create-only (temp name + link); stray temp files are cleaned by the next attempt. A signal
that arrives once the exit code is decided (:func:`leave`) exits with that code at once: a signal after
the shard completed exits 0.

:func:`leave` ends the process: ``atexit`` callbacks, then the log and standard streams flushed, then
``os._exit``, so no interpreter finalization runs (it would restore the default SIGTERM action first, then
run static destructors of native thread pools and tear down daemon threads inside native code).

This module imports only the standard library (it runs before the rest of the worker is imported).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import NoReturn

log = logging.getLogger(__name__)

EXIT_INTERRUPTED = 75
"""``batch_contract.enums.ExitCode.INTERRUPTED`` (EX_TEMPFAIL), here as a literal: importing
``batch_contract`` loads pyarrow, which the entry must not wait for before installing the handler."""

DEFAULT_GRACE_SECONDS = 25.0
"""Grace (seconds) of a signal that arrives before the manifest's ``worker.grace_seconds`` is known
(``WorkerSettings.grace_seconds``' default); :meth:`StopSignal.configure` replaces it."""


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
        self._exit_code: int | None = None

    @property
    def requested(self) -> bool:
        """True once SIGTERM or SIGINT was received."""
        return self._event.is_set()

    def __call__(self) -> bool:
        return self._event.is_set()

    def install(self) -> StopSignal:
        """Handle SIGTERM and SIGINT from now on (main thread only); returns ``self``."""
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

    def configure(self, grace_seconds: float, on_hard_exit: Callable[[str], None] | None = None) -> None:
        """Set the grace period (seconds) and the hard-exit hook once they are known (the manifest read).

        A signal already received keeps its deadline relative to when it arrived: the watchdog is re-armed
        for what is left of the new grace period (at once when nothing is left).
        """
        self.grace_seconds = grace_seconds
        if on_hard_exit is not None:
            self.on_hard_exit = on_hard_exit
        if self._timer is not None and self.received_at is not None:
            self._timer.cancel()
            self._arm(self._watchdog_seconds() - (time.monotonic() - self.received_at))

    def exiting(self, code: int) -> None:
        """The process's exit code is decided: a signal from now on exits with ``code`` at once."""
        self._exit_code = code

    def _watchdog_seconds(self) -> float:
        # leave a second (or 10 %) of the grace for the exit itself
        return max(self.grace_seconds - 1.0, 0.9 * self.grace_seconds)

    def _arm(self, seconds: float) -> None:
        timer = threading.Timer(max(seconds, 0.0), self._hard_exit, args=("grace period over",))
        timer.daemon = True
        timer.start()
        self._timer = timer

    def _handle(self, signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if self._exit_code is not None:  # everything is done: leave with the decided code now
            _flush_and_exit(self._exit_code)
        if self._event.is_set():
            self._hard_exit(f"second signal {name}")
            return
        self.signal_name = name
        self.received_at = time.monotonic()
        self._event.set()
        log.warning("%s received: finishing the in-flight batch, committing, exiting %d within %.0f s",
                    name, EXIT_INTERRUPTED, self.grace_seconds)
        self._arm(self._watchdog_seconds())

    def _hard_exit(self, why: str) -> None:
        log.error("%s: abandoning in-flight work, exiting %d now", why, EXIT_INTERRUPTED)
        if self.on_hard_exit is not None:
            try:
                self.on_hard_exit(why)
            except Exception:  # best effort only: never delay the exit
                pass
        _flush_and_exit(EXIT_INTERRUPTED)


def _flush_and_exit(code: int) -> NoReturn:
    """Flush the log handlers and the standard streams, then ``os._exit(code)`` (no finalization)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    os._exit(code)


def leave(code: int, stop: StopSignal) -> NoReturn:
    """End the process with exit code ``code`` (see the module docstring).

    Everything the worker commits is durable when its command returns (commits are fsynced create-only
    files, the attempt record is rewritten before the return), so the process runs its ``atexit``
    callbacks (Python-level clean-up: child processes, temp files) and leaves with ``os._exit(code)``:
    the interpreter's own finalization, which restores the default SIGTERM action and then destroys
    modules and native thread pools, is skipped. From the call on, a signal ends the process with
    ``code`` at once.

    Args:
        code: the exit code (an ``ExitCode`` value).
        stop: the process's installed :class:`StopSignal`.
    """
    stop.exiting(code)
    if stop.requested:
        log.info("%s handled: exiting %d", stop.signal_name, code)
    try:
        atexit._run_exitfuncs()
    except Exception:  # noqa: BLE001 - clean-up only: the exit code is decided
        log.exception("an atexit callback failed; exiting %d", code)
    _flush_and_exit(code)
