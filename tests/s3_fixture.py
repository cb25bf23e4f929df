"""A real S3-compatible server for tests: moto's standalone server (``moto[server]``) on a free
loopback port.

Use from any test module (``tests`` is on pytest's ``pythonpath``)::

    import s3_fixture

    moto_s3, s3_bucket = s3_fixture.moto_s3, s3_fixture.s3_bucket  # pytest fixtures

    def test_x(s3_bucket):             # "s3://test-<hex>", a fresh empty bucket
        storage.write_create_only(f"{s3_bucket}/a.json", b"{}")

``moto_s3`` (session scoped) starts ``python -m moto.server`` once, points ``AWS_ENDPOINT_URL`` at it and
sets dummy credentials for the whole session (so subprocesses started by tests inherit them), and kills
the server at the end. ``s3_fault_proxy`` puts :class:`gcs_fixture.FaultProxy` in front of it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from gcs_fixture import FaultProxy, _die_with_parent, free_port

START_TIMEOUT_S = 30.0
CREDENTIAL_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing-secret-key",
                  "AWS_REGION": "us-east-1"}
"""Dummy credentials and region for the emulator (moto accepts any key; nothing leaves 127.0.0.1)."""


class MotoS3Server:
    """One moto server process (in memory) on 127.0.0.1.

    Args:
        port: TCP port; a free one when ``None``.
    """

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log = tempfile.TemporaryFile()

    def start(self) -> MotoS3Server:
        """Start the process and wait until it answers; raises ``RuntimeError`` with its log if not."""
        cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=self._log, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        self._log.seek(0)
        raise RuntimeError(f"moto server did not start on {self.url}: {self._log.read()[-2000:]!r}")

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (boto3, against this server); returns ``s3://name``."""
        import boto3

        boto3.client("s3", endpoint_url=self.url, region_name=CREDENTIAL_ENV["AWS_REGION"],
                     aws_access_key_id=CREDENTIAL_ENV["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=CREDENTIAL_ENV["AWS_SECRET_ACCESS_KEY"]).create_bucket(Bucket=name)
        return f"s3://{name}"

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
def moto_s3() -> Iterator[MotoS3Server]:
    """A running moto S3 server; ``AWS_ENDPOINT_URL`` and dummy credentials point at it for the session."""
    server = MotoS3Server().start()
    env = {**CREDENTIAL_ENV, "AWS_ENDPOINT_URL": server.url}
    previous = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield server
    finally:
        server.stop()
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def s3_bucket(moto_s3: MotoS3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """``s3://<fresh bucket>`` on the session's moto server (env re-pointed at it for this test; the
    bucket is added to ``BATCH_INFERENCE_ALLOWED_ROOTS`` so DAG runs may read and write it)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_s3.url)
    bucket = moto_s3.create_bucket(f"test-{uuid.uuid4().hex[:12]}")
    roots = os.environ.get("BATCH_INFERENCE_ALLOWED_ROOTS", "")
    monkeypatch.setenv("BATCH_INFERENCE_ALLOWED_ROOTS", f"{roots},{bucket}" if roots else bucket)
    return bucket


@pytest.fixture
def s3_fault_proxy(moto_s3: MotoS3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """A :class:`gcs_fixture.FaultProxy` in front of the session's server; ``AWS_ENDPOINT_URL`` points
    at it for the test."""
    proxy = FaultProxy(upstream=moto_s3.url)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    try:
        yield proxy
    finally:
        proxy.close()


def main(argv: list[str] | None = None) -> int:
    """Run moto's S3 server in the foreground for manual use (``make run-s3`` starts its own).

    ``python tests/s3_fixture.py --port 5000 --bucket demo --upload data/sample/x.parquet=s3://demo/in/x.parquet``
    prints the ``export`` lines and serves until Ctrl-C (in memory: data is lost).
    """
    import argparse

    parser = argparse.ArgumentParser(description="moto S3 server on 127.0.0.1 for manual runs")
    parser.add_argument("--port", type=int, default=5000)
    parser.add_argument("--bucket", action="append", default=[], help="bucket to create (repeatable)")
    parser.add_argument("--upload", action="append", default=[], metavar="PATH=s3://BUCKET/NAME",
                        help="local file to upload after start (repeatable)")
    args = parser.parse_args(argv)
    server = MotoS3Server(args.port).start()
    os.environ.update({**CREDENTIAL_ENV, "AWS_ENDPOINT_URL": server.url})
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
        for key, value in {**CREDENTIAL_ENV, "AWS_ENDPOINT_URL": server.url}.items():
            print(f"export {key}={value}", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
