"""One container of a pod as a local process group, and its log in the CRI file format.

The node agent runs ``command + args`` with the pod's env in a per-pod working directory, in a new
session (so SIGTERM/SIGKILL reach the whole process group, like a container's PID namespace), and pumps
its merged stdout/stderr line by line into ``<container>.log``: ``<RFC 3339 nano timestamp> stdout F
<line>`` per line, the format a real kubelet serves from. :func:`read_log` applies the ``pods/log``
options (``timestamps``, ``sinceSeconds``/``sinceTime``, ``tailLines``, ``limitBytes``).
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

START_ERROR_EXIT = 128
"""Exit code a container runtime reports when the command could not be started (``StartError``)."""


def now_rfc3339(nano: bool = False) -> str:
    """UTC now as Kubernetes writes it: ``2026-12-01T06:00:00Z`` (or with nanoseconds for log lines)."""
    now = dt.datetime.now(dt.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%f000Z") if nano else now.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(value: str) -> dt.datetime:
    """Parse ``...Z`` timestamps with 0-9 fractional digits (Python keeps microseconds)."""
    head, _, frac = value.rstrip("Z").partition(".")
    micro = int((frac + "000000")[:6]) if frac else 0
    return dt.datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(microsecond=micro, tzinfo=dt.UTC)


class StartError(RuntimeError):
    """The container's command could not be started (not found, not executable); the runtime's message."""


def exit_code(returncode: int) -> int:
    """A container exit code from ``Popen.returncode``: a death by signal N is ``128 + N`` (137 for
    SIGKILL, 143 for SIGTERM), as container runtimes report it."""
    return 128 - returncode if returncode < 0 else returncode


class ContainerProcess:
    """One running container.

    Args:
        argv: ``command + args`` (``argv[0]`` looked up on the env's ``PATH``).
        env: the complete environment of the process.
        cwd: working directory (exists).
        log_path: the CRI-format log file to append to.

    Raises:
        StartError: from :meth:`start` when ``argv`` is empty or ``argv[0]`` cannot be executed.
    """

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, log_path: Path) -> None:
        self.argv, self.env, self.cwd, self.log_path = list(argv), dict(env), Path(cwd), Path(log_path)
        self.proc: subprocess.Popen[bytes] | None = None
        self._pump: threading.Thread | None = None
        self.started_at = ""
        self.finished_at = ""

    def start(self) -> None:
        """Start the process group and the log pump."""
        if not self.argv:
            raise StartError("no command specified")
        exe = shutil.which(self.argv[0], path=self.env.get("PATH")) if "/" not in self.argv[0] else self.argv[0]
        if exe is None or not os.access(exe, os.X_OK):
            raise StartError(f'exec: "{self.argv[0]}": executable file not found in $PATH')
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.touch()
        try:
            self.proc = subprocess.Popen([exe, *self.argv[1:]], env=self.env, cwd=self.cwd,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise StartError(f"exec: {exc}") from exc
        self.started_at = now_rfc3339()
        self._pump = threading.Thread(target=self._pump_lines, name=f"log-{self.log_path.name}", daemon=True)
        self._pump.start()

    def _pump_lines(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with open(self.log_path, "ab", buffering=0) as out:
            for raw in iter(self.proc.stdout.readline, b""):
                line = raw.rstrip(b"\n")
                out.write(now_rfc3339(nano=True).encode() + b" stdout F " + line + b"\n")

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the whole process group (no-op once it has exited)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signum)
            except ProcessLookupError:
                pass

    def wait(self) -> int:
        """Block until the process exits and its log is drained; the container exit code."""
        assert self.proc is not None
        code = self.proc.wait()
        # Children that outlive the main process (a shell's background jobs) die with it, as in a
        # container whose PID 1 exits; only then is the pipe closed and the log drained.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self._pump is not None:
            self._pump.join()
        self.finished_at = now_rfc3339()
        return exit_code(code)

    @property
    def running(self) -> bool:
        """True while the main process has not exited."""
        return self.proc is not None and self.proc.poll() is None


@dataclass(frozen=True)
class LogLine:
    """One log entry: RFC 3339 nano timestamp, stream name, text (bytes, no newline)."""

    timestamp: str
    stream: str
    text: bytes

    @classmethod
    def parse(cls, raw: bytes) -> LogLine:
        """Parse one CRI line ``<ts> <stream> <F|P> <text>``."""
        ts, stream, _tag, text = (raw.rstrip(b"\n").split(b" ", 3) + [b"", b"", b""])[:4]
        return cls(ts.decode(), stream.decode(), text)

    def render(self, timestamps: bool) -> bytes:
        """The line as ``pods/log`` returns it (with ``timestamps=true``: ``<ts> <text>``)."""
        return (self.timestamp.encode() + b" " if timestamps else b"") + self.text + b"\n"


def read_log(path: Path, *, since: dt.datetime | None = None, tail_lines: int | None = None,
             offset: int = 0) -> tuple[list[LogLine], int]:
    """Complete lines of a CRI log from byte ``offset``: ``(lines, next offset)``.

    Args:
        since: keep lines stamped at or after this instant (``sinceSeconds`` / ``sinceTime``).
        tail_lines: keep only the last N of those (``tailLines``).
        offset: byte offset to start at (a follower's position); a trailing partial line is left for later.
    """
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read()
    end = data.rfind(b"\n") + 1
    lines = [LogLine.parse(raw) for raw in data[:end].splitlines()]
    if since is not None:
        lines = [ln for ln in lines if parse_rfc3339(ln.timestamp) >= since]
    if tail_lines is not None:
        lines = lines[-tail_lines:] if tail_lines > 0 else []
    return lines, offset + end
