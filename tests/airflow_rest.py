"""A small HTTP client for Airflow's REST API in tests (``urllib``, no redirects), the admin user's calls
(:class:`AdminRestClient`), and free loopback ports.

Used by ``tests/ui/ui_standalone.py`` (``airflow standalone``) and ``tests/airflow_services.py`` (the
separate scheduler, triggerer, DAG processor and API server of the live-cluster suite).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Response:
    """An HTTP answer: status, headers (lower-case names), body bytes."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


HTTP_TIMEOUT_S = 180.0
"""Seconds a test waits for one answer of the API server. Not a latency bound: in a CI run on a loaded
2-core host (the live cluster importing the worker image beside it) Airflow's API server answered no
request for 67 s, then every request in flight at once; 60 s failed the UI suite's set-up."""


def http(method: str, url: str, *, token: str | None = None, body: Any = None,
         cookies: dict[str, str] | None = None, timeout: float = HTTP_TIMEOUT_S) -> Response:
    """One request with ``urllib`` (no redirects followed for 3xx is not needed here: none are hit)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if cookies:
        req.add_header("Cookie", "; ".join(f"{k}={v}" for k, v in cookies.items()))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Response(resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read())
    except urllib.error.HTTPError as exc:
        return Response(exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read())


class AdminRestClient:
    """Airflow's REST API as the SimpleAuthManager ``admin`` user, for a class with ``url`` (the API
    server's base URL), ``password`` and a ``_token`` attribute (``""`` until the first login)."""

    url: str
    password: str
    _token: str

    def token(self) -> str:
        """A JWT for the admin user (``POST /auth/token``), cached."""
        if not self._token:
            resp = http("POST", f"{self.url}/auth/token", body={"username": "admin", "password": self.password})
            if resp.status != 201:
                raise ValueError(f"login failed: {resp.status} {resp.body[:200]!r}")
            self._token = resp.json()["access_token"]
        return self._token

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """A call of Airflow's REST API as admin; raises ``ValueError`` on a non-2xx answer."""
        resp = http(method, f"{self.url}{path}", token=self.token(), body=body)
        if not 200 <= resp.status < 300:
            raise ValueError(f"{method} {path}: {resp.status} {resp.body[:500]!r}")
        return resp.json()

    def dag_ids(self) -> list[str]:
        return [d["dag_id"] for d in self.api("GET", "/api/v2/dags?limit=100")["dags"]]

    def trigger(self, dag_id: str, conf: dict[str, Any]) -> str:
        """Unpause ``dag_id`` and trigger a run with ``conf``; returns its run id."""
        self.api("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
        return self.api("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf})["dag_run_id"]
