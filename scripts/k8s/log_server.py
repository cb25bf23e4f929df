"""The kubelet's container-log endpoint over HTTPS, which the API server proxies ``pods/log`` to.

``GET /containerLogs/<namespace>/<pod>/<container>`` with the query options KubernetesPodOperator and
``kubectl logs`` send: ``follow``, ``timestamps``, ``sinceSeconds``, ``sinceTime``, ``tailLines``,
``limitBytes``. With ``follow=true`` the answer streams until the container has exited and its log is
drained (or the client goes away). ``GET /healthz`` answers ``ok``.
"""

from __future__ import annotations

import datetime as dt
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from .pod_process import parse_rfc3339, read_log

FOLLOW_POLL_S = 0.2
"""How often a follower looks for new log lines (seconds)."""

Resolver = Callable[[str, str, str], "tuple[Path, Callable[[], bool]] | str"]
"""``(namespace, pod, container) -> (log path, has the container exited?)``, or an error message (404)."""


def _options(query: str) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(query).items()}


def _since(opts: dict[str, str]) -> dt.datetime | None:
    if "sinceTime" in opts:
        return parse_rfc3339(opts["sinceTime"])
    if "sinceSeconds" in opts:
        return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=int(opts["sinceSeconds"]))
    return None


class _Handler(BaseHTTPRequestHandler):
    server: LogServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        self.server.log(f"log-server: {self.address_string()} {format % args}")

    def _plain(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - stdlib name
        url = urlparse(self.path)
        parts = url.path.strip("/").split("/")
        if url.path == "/healthz":
            return self._plain(200, b"ok")
        if len(parts) != 4 or parts[0] != "containerLogs":
            return self._plain(404, b"not found")
        found = self.server.resolve(parts[1], parts[2], parts[3])
        if isinstance(found, str):
            return self._plain(404, found.encode())
        try:
            self._stream(found[0], found[1], _options(url.query))
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
            pass  # the client (API server proxy) went away: a follower stopped reading

    def _stream(self, path: Path, done: Callable[[], bool], opts: dict[str, str]) -> None:
        timestamps = opts.get("timestamps") == "true"
        follow = opts.get("follow") == "true"
        limit = int(opts["limitBytes"]) if "limitBytes" in opts else None
        tail = int(opts["tailLines"]) if "tailLines" in opts else None
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        lines, offset = read_log(path, since=_since(opts), tail_lines=tail)
        sent = 0
        while True:
            for line in lines:
                chunk = line.render(timestamps)
                if limit is not None and sent + len(chunk) > limit:
                    self.wfile.write(chunk[: limit - sent])
                    return
                self.wfile.write(chunk)
                sent += len(chunk)
            self.wfile.flush()
            if not follow:
                return
            finished = done()
            lines, offset = read_log(path, offset=offset)
            if finished and not lines:
                return
            if not lines:
                time.sleep(FOLLOW_POLL_S)


class LogServer(ThreadingHTTPServer):
    """HTTPS log server on ``127.0.0.1:port`` (0 = a free port; see :attr:`port`).

    Args:
        port: TCP port.
        cert / key: PEM serving certificate (signed by the cluster CA, SAN 127.0.0.1) and key.
        resolve: see :data:`Resolver`.
        log: where request lines go (the agent's log).
    """

    daemon_threads = True

    def __init__(self, port: int, cert: Path, key: Path, resolve: Resolver, log: Callable[[str], None]) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        self.socket = ctx.wrap_socket(self.socket, server_side=True)
        self.resolve, self.log = resolve, log
        self.port = self.server_address[1]
        self._thread = threading.Thread(target=self.serve_forever, name="log-server", daemon=True)

    def start(self) -> LogServer:
        """Serve in a daemon thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.shutdown()
        self.server_close()
