"""A real Azure Blob Storage server for tests: Azurite on a free loopback port.

Use from any test module (``tests`` is on pytest's ``pythonpath``)::

    import azure_fixture

    azurite, azure_container = azure_fixture.azurite, azure_fixture.azure_container  # pytest fixtures

    def test_x(azure_container):       # "az://test-<hex>", a fresh empty container
        storage.write_create_only(f"{azure_container}/a.json", b"{}")

``azurite`` (session scoped) installs Azurite once per machine (``scripts/ensure_azurite.sh``: npm, into
the user cache), starts its blob service in memory, sets ``AZURE_STORAGE_CONNECTION_STRING`` (Azurite's
well-known ``devstoreaccount1`` key) for the whole session (so subprocesses started by tests inherit it)
and kills the server at the end. ``azure_fault_proxy`` puts a :class:`RecordingFaultProxy` in front of
it to inject lost replies, cut connections and error statuses.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from gcs_fixture import FaultProxy, free_port

START_TIMEOUT_S = 30.0
REPO_ROOT = Path(__file__).resolve().parents[1]
ENSURE_SCRIPT = REPO_ROOT / "scripts" / "ensure_azurite.sh"
CONNECTION_STRING_ENV = "AZURE_STORAGE_CONNECTION_STRING"
ACCOUNT_NAME = "devstoreaccount1"
ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""Azurite's well-known development account and key (public, documented by Microsoft)."""


EXTENT_MEMORY_LIMIT_MB = 2048
"""Cap of Azurite's in-memory blob data (its default is half the machine's memory)."""


def _kill_with_parent() -> None:
    """In the child before exec: ask Linux to SIGKILL it when the test process dies (no orphan Azurite
    after a killed pytest run; SIGTERM, as gcs_fixture's ``_die_with_parent`` sends, does not end it).
    A no-op elsewhere."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def connection_string(port: int) -> str:
    """The connection string of Azurite's development account on ``127.0.0.1:port`` (path-style URL)."""
    return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT_NAME};AccountKey={ACCOUNT_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{port}/{ACCOUNT_NAME};")


def azurite_main_js() -> Path:
    """Path of Azurite's blob server entry point, installed by ``scripts/ensure_azurite.sh`` if needed.

    Raises:
        RuntimeError: the script failed (no node/npm, no registry access); its message is included.
    """
    done = subprocess.run(["bash", str(ENSURE_SCRIPT)], capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{ENSURE_SCRIPT.name} failed: {done.stderr.strip()[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


class AzuriteServer:
    """One Azurite blob service process (in-memory, plain HTTP) on 127.0.0.1.

    Args:
        port: TCP port; a free one when ``None``.
    """

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.connection_string = connection_string(self.port)
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()
        self._workdir = tempfile.TemporaryDirectory(prefix="azurite-")

    def start(self) -> AzuriteServer:
        """Start the process and wait until it answers HTTP; raises ``RuntimeError`` with its log if not."""
        cmd = ["node", str(azurite_main_js()), "--blobHost", "127.0.0.1", "--blobPort", str(self.port),
               "--inMemoryPersistence", "--extentMemoryLimit", str(EXTENT_MEMORY_LIMIT_MB),
               "--skipApiVersionCheck", "--loose", "--silent"]
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=self._log, cwd=self._workdir.name,
                                      preexec_fn=_kill_with_parent)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.url}/{ACCOUNT_NAME}?comp=list", timeout=1):
                    return self
            except urllib.error.HTTPError:  # 403 without a signature: the server is up
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        self._log.seek(0)
        raise RuntimeError(f"Azurite did not start on {self.url}: {self._log.read()[-2000:]!r}")

    def service_client(self, conn_str: str | None = None):
        """A plain ``BlobServiceClient`` (SDK defaults) on this server, or on ``conn_str``."""
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(conn_str or self.connection_string)

    def create_container(self, name: str) -> str:
        """Create container ``name``; returns ``az://name``."""
        self.service_client().create_container(name)
        return f"az://{name}"

    def stop(self) -> None:
        """Kill the process (SIGKILL: its data lives in memory only, and Azurite 3.37 closes its server on
        SIGTERM but its node process does not exit)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
        self._workdir.cleanup()


def new_container_name(prefix: str = "test") -> str:
    """A fresh container name: 3-63 characters of lower-case letters, digits and hyphens."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def azurite() -> Iterator[AzuriteServer]:
    """A running Azurite; ``AZURE_STORAGE_CONNECTION_STRING`` points at it for the session (and
    ``AZURE_STORAGE_ACCOUNT_NAME`` is cleared, so the connection string is what counts)."""
    server = AzuriteServer().start()
    previous = {name: os.environ.get(name) for name in (CONNECTION_STRING_ENV, "AZURE_STORAGE_ACCOUNT_NAME")}
    os.environ[CONNECTION_STRING_ENV] = server.connection_string
    os.environ.pop("AZURE_STORAGE_ACCOUNT_NAME", None)
    try:
        yield server
    finally:
        server.stop()
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def azure_container(azurite: AzuriteServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """``az://<fresh container>`` on the session's Azurite (env re-pointed at it for this test; the
    container is added to ``BATCH_INFERENCE_ALLOWED_ROOTS`` so DAG runs may read and write it)."""
    monkeypatch.setenv(CONNECTION_STRING_ENV, azurite.connection_string)
    container = azurite.create_container(new_container_name())
    roots = os.environ.get("BATCH_INFERENCE_ALLOWED_ROOTS", "")
    monkeypatch.setenv("BATCH_INFERENCE_ALLOWED_ROOTS", f"{roots},{container}" if roots else container)
    return container


@dataclass
class RecordingFaultProxy(FaultProxy):
    """A :class:`FaultProxy` that also records ``(method, path, headers)`` of every request it forwards
    upstream (headers with lower-case names), so a test can check what the client sent (``If-None-Match``)."""

    forwarded: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._record_lock = threading.Lock()
        super().__post_init__()

    def _handler_class(self):
        base = super()._handler_class()

        class Handler(base):
            # The base handler writes a reply's headers and body in two sends; with Nagle's algorithm the
            # body then waits for the client's delayed ACK (about 40 ms per GET).
            disable_nagle_algorithm = True

        return Handler

    def _forward(self, method: str, path: str, headers: dict[str, str], body: bytes):
        with self._record_lock:
            self.forwarded.append((method, path, {k.lower(): v for k, v in headers.items()}))
        return super()._forward(method, path, headers, body)


@pytest.fixture
def azure_fault_proxy(azurite: AzuriteServer,
                      monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingFaultProxy]:
    """A :class:`RecordingFaultProxy` in front of the session's Azurite; ``AZURE_STORAGE_CONNECTION_STRING``
    names the proxy's port for this test (a new client is built for it)."""
    proxy = RecordingFaultProxy(upstream=azurite.url)
    monkeypatch.setenv(CONNECTION_STRING_ENV, connection_string(proxy.port))
    try:
        yield proxy
    finally:
        proxy.close()


def main(argv: list[str] | None = None) -> int:
    """Run Azurite in the foreground for manual use (``make run`` against the emulator).

    ``python tests/azure_fixture.py --port 10000 --container demo
    --upload data/sample/x.parquet=az://demo/in/x.parquet`` prints the
    ``export AZURE_STORAGE_CONNECTION_STRING=...`` line and serves until Ctrl-C (in memory: data is lost).
    """
    import argparse
    import shlex

    parser = argparse.ArgumentParser(description="Azurite (blob service) on 127.0.0.1 for manual runs")
    parser.add_argument("--port", type=int, default=10000)
    parser.add_argument("--container", action="append", default=[], help="container to create (repeatable)")
    parser.add_argument("--upload", action="append", default=[], metavar="PATH=az://CONTAINER/NAME",
                        help="local file to upload after start (repeatable)")
    args = parser.parse_args(argv)
    server = AzuriteServer(args.port).start()
    os.environ[CONNECTION_STRING_ENV] = server.connection_string
    try:
        for name in args.container:
            server.create_container(name)
        if args.upload:
            sys.path.insert(0, str(REPO_ROOT / "plugins"))
            from batch_contract import storage

            for spec in args.upload:
                path, _, uri = spec.partition("=")
                storage.write_create_only(uri, Path(path).read_bytes())
                print(f"uploaded {path} -> {uri}", flush=True)
        print(f"export {CONNECTION_STRING_ENV}={shlex.quote(server.connection_string)}", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
