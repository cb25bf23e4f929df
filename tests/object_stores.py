"""One interface over the object-store emulators the tests start on 127.0.0.1: fake-gcs-server
(``gs``), moto's S3 server (``s3``) and Azurite (``az``), for code that runs the same thing on each
scheme (the storage-fault tests, ``make run-s3`` / ``make run-azure``, ``make bench-storage``).

    with object_stores.started("s3") as store:
        root = store.new_root("demo")               # "s3://demo-<hex>", a fresh empty bucket
        env = store.env()                            # what a subprocess needs to reach it
        env_via_proxy = store.env(proxy.url)         # the same, through a fault proxy in front of it

Each emulator's own fixture module (``gcs_fixture``, ``s3_fixture``, ``azure_fixture``) starts the server;
this module only adapts them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

SCHEMES = ("gs", "s3", "az")
"""Remote schemes with an emulator here, in the order the tests and the benchmark report them."""


@dataclass
class EmulatedStore:
    """A running emulator of one scheme.

    Attributes:
        scheme: ``"gs"``, ``"s3"`` or ``"az"``.
        server: the fixture module's server object (``FakeGcsServer``, ``MotoS3Server``, ``AzuriteServer``).
    """

    scheme: str
    server: Any

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``: the upstream a fault proxy forwards to."""
        parts = urlsplit(self.server.url)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def error_style(self) -> str:
        """The :attr:`fault_proxy.FaultPlan.error_style` of this scheme's service."""
        return {"gs": "gcs", "s3": "s3", "az": "azure"}[self.scheme]

    def new_root(self, prefix: str = "test") -> str:
        """A fresh empty bucket (container) named ``<prefix>-<hex>``, as ``<scheme>://<name>``."""
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        if self.scheme == "az":
            return self.server.create_container(name)
        return self.server.create_bucket(name)

    def env(self, endpoint: str | None = None) -> dict[str, str]:
        """Environment variables that point the storage backend of this scheme at ``endpoint``
        (``http://127.0.0.1:<port>``, default the emulator itself) with the emulator's credentials."""
        endpoint = (endpoint or self.url).rstrip("/")
        if self.scheme == "gs":
            return {"STORAGE_EMULATOR_HOST": endpoint}
        if self.scheme == "s3":
            from s3_fixture import CREDENTIAL_ENV

            return {**CREDENTIAL_ENV, "AWS_ENDPOINT_URL": endpoint}
        from azure_fixture import CONNECTION_STRING_ENV, connection_string

        port = urlsplit(endpoint).port
        assert port is not None, endpoint
        return {CONNECTION_STRING_ENV: connection_string(port)}

    def stop(self) -> None:
        """Stop the emulator."""
        self.server.stop()


def start(scheme: str) -> EmulatedStore:
    """Start the emulator of ``scheme`` (not its environment: see :meth:`EmulatedStore.env`).

    Raises:
        ValueError: no emulator for ``scheme``.
        RuntimeError: the emulator did not start (its log in the message).
    """
    if scheme == "gs":
        from gcs_fixture import FakeGcsServer

        return EmulatedStore(scheme, FakeGcsServer().start())
    if scheme == "s3":
        from s3_fixture import MotoS3Server

        return EmulatedStore(scheme, MotoS3Server().start())
    if scheme == "az":
        from azure_fixture import AzuriteServer

        return EmulatedStore(scheme, AzuriteServer().start())
    raise ValueError(f"no emulator for scheme {scheme!r} (known: {', '.join(SCHEMES)})")


@contextmanager
def started(scheme: str, *, set_env: bool = True) -> Iterator[EmulatedStore]:
    """:func:`start`, with its :meth:`~EmulatedStore.env` in ``os.environ`` while the block runs
    (``set_env``; restored after), and the emulator stopped at the end."""
    store = start(scheme)
    env = store.env() if set_env else {}
    previous = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield store
    finally:
        store.stop()
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
