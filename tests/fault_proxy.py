"""A fault-injecting loopback HTTP proxy for storage-fault tests (stdlib only).

Put it in front of an object-store emulator (fake-gcs-server, moto's S3 server, Azurite) and point
clients at the proxy instead of the emulator. Each request is either forwarded untouched or, with probability ``FaultPlan.rate`` (drawn from
a seeded ``random.Random``), answered with one fault:

* ``429`` / ``503``: an error reply (JSON body in the GCS error shape) *before* anything reaches the
  emulator, so the request had no effect: a correct client retries it.
* ``reset``: the TCP connection is reset (``SO_LINGER`` 0) before forwarding; no effect upstream.
* ``reset_after``: the request IS forwarded and applied upstream, then the reply is dropped with a reset.
  This is the "lost commit reply" case: a retried create-only upload meets its own object (412) and must
  be treated as success when the content is equal.
* ``delay``: the reply is held for ``FaultPlan.delay_seconds`` and then delivered normally.

Targeted faults (in-thread :class:`FaultProxy` only): ``script`` is a list of :class:`ScriptedFault` s,
each hitting the n-th request of one upload step (:func:`upload_step`: the multipart upload, the
resumable session's initiating POST, a middle chunk PUT or the final chunk PUT), e.g. dropping the final
chunk's reply after the emulator finalized the object. ``gcs_resumable=True`` makes resumable uploads
behave as on real GCS where fake-gcs-server differs (see :class:`_ResumableShim`).

No single request key (method + path + query) is faulted more than ``max_consecutive`` times in a row, so
a client with a bounded retry budget always gets through; the fault rate stays what was asked for in
aggregate. ``Location`` headers and JSON bodies that name the emulator's own URL are rewritten to the
proxy's URL so resumable uploads keep going through the proxy.

Usage::

    with FaultProxy("http://127.0.0.1:4443", FaultPlan(rate=0.2, seed=7)) as proxy:
        os.environ["STORAGE_EMULATOR_HOST"] = proxy.url
        ...
        print(proxy.stats.by_kind)
"""

from __future__ import annotations

import http.client
import json
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

_CONTROL = "/__fault_proxy__/"

ERROR_STYLES = ("gcs", "s3", "azure")
"""Shapes of an injected error reply (:attr:`FaultPlan.error_style`)."""
FAULT_KINDS = ("429", "503", "reset", "reset_after", "delay")
"""Every fault kind the proxy can inject (see the module docstring)."""

_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
}


@dataclass(frozen=True)
class FaultPlan:
    """What to inject and how often.

    Attributes:
        rate: probability in ``[0, 1]`` that one request gets a fault.
        seed: seed of the ``random.Random`` that draws faults (same seed, same sequence of draws).
        kinds: fault kinds to draw from, uniformly (subset of :data:`FAULT_KINDS`).
        delay_seconds: how long a ``delay`` fault holds the reply, seconds.
        max_consecutive: most faults in a row for one request key (method + path + query) before the
            next attempt is let through; bounds the retries a client needs.
        error_style: the shape of an injected 429/503 reply, as the emulated service sends it: ``"gcs"``
            (a JSON error object), ``"s3"`` (an XML ``<Error>`` with ``SlowDown``) or ``"azure"`` (an XML
            ``<Error>`` with ``ServerBusy`` and the ``x-ms-error-code`` header). Clients parse error
            bodies by the service's format; the Azure C++ SDK in pyarrow aborts the process on a JSON
            body it cannot read, which no Azure endpoint sends.
    """

    rate: float = 0.2
    seed: int = 0
    kinds: tuple[str, ...] = FAULT_KINDS
    delay_seconds: float = 0.3
    max_consecutive: int = 2
    error_style: str = "gcs"

    def __post_init__(self) -> None:
        if self.error_style not in ERROR_STYLES:
            raise ValueError(f"FaultPlan.error_style: {self.error_style!r}; choose from {ERROR_STYLES}")
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"FaultPlan.rate: {self.rate} is outside [0, 1]")
        unknown = sorted(set(self.kinds) - set(FAULT_KINDS))
        if unknown or not self.kinds:
            raise ValueError(f"FaultPlan.kinds: {unknown or 'empty'}; choose from {FAULT_KINDS}")
        if self.delay_seconds < 0 or self.max_consecutive < 0:
            raise ValueError("FaultPlan.delay_seconds and max_consecutive must be >= 0")


@dataclass
class ProxyStats:
    """What the proxy did. ``by_kind`` counts faults per kind; ``log`` holds (method, path, fault-or-'ok')."""

    requests: int = 0
    forwarded: int = 0
    by_kind: Counter = field(default_factory=Counter)
    log: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def faults(self) -> int:
        return sum(self.by_kind.values())


class _Decider:
    """Thread-safe seeded fault draws with a per-key consecutive-fault cap."""

    def __init__(self, plan: FaultPlan) -> None:
        self.plan = plan
        self._rng = random.Random(plan.seed)
        self._lock = threading.Lock()
        self._streak: Counter = Counter()
        self.stats = ProxyStats()
        self.active = True

    def draw(self, method: str, path: str) -> str | None:
        key = f"{method} {path}"
        with self._lock:
            self.stats.requests += 1
            fault = None
            if self.active and self._rng.random() < self.plan.rate and self._streak[key] < self.plan.max_consecutive:
                fault = self._rng.choice(self.plan.kinds)
            if fault in (None, "delay"):
                self._streak[key] = 0
            else:
                self._streak[key] += 1
            if fault is not None:
                self.stats.by_kind[fault] += 1
            self.stats.log.append((method, path, fault or "ok"))
            return fault


UPLOAD_STEPS = ("multipart", "initiate", "middle", "final")
"""Upload requests :func:`upload_step` tells apart (the targets of a :class:`ScriptedFault`)."""

_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


def upload_step(method: str, path: str, headers: Mapping[str, str]) -> str | None:
    """Which step of an upload a request is, or ``None`` for anything else (reads, status queries).

    ``"multipart"``: ``POST .../upload/...?uploadType=multipart`` (objects up to 8 MiB);
    ``"initiate"``: ``POST ...?uploadType=resumable`` (opens a session); ``"middle"`` / ``"final"``: a
    ``PUT`` to a session whose ``Content-Range: bytes a-b/total`` ends before / at the last byte.
    """
    query = parse_qs(urlsplit(path).query)
    if "/upload/" not in path:
        return None
    if method == "POST":
        kind = query.get("uploadType", [""])[0]
        return {"multipart": "multipart", "resumable": "initiate"}.get(kind)
    if method == "PUT" and "upload_id" in query:
        match = _RANGE.fullmatch(headers.get("Content-Range", "").strip())
        if match is None:
            return None  # a status query (bytes */total) or an empty body
        end, total = int(match.group(2)), match.group(3)
        return "final" if total != "*" and end + 1 == int(total) else "middle"
    return None


@dataclass
class ScriptedFault:
    """One targeted fault: the ``nth`` request of upload step ``step`` gets ``kind``.

    Attributes:
        step: one of :data:`UPLOAD_STEPS`.
        kind: ``"reset_after"`` (forward, then drop the reply: a lost reply), ``"reset"``, ``"429"``,
            ``"503"``, or ``None`` (forward normally: only ``before`` runs).
        nth: which request of that step, counting from 1 (retries count too).
        before: called in the proxy thread before the request is forwarded (e.g. another writer commits).
    """

    step: str
    kind: str | None = "reset_after"
    nth: int = 1
    before: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        if self.step not in UPLOAD_STEPS:
            raise ValueError(f"ScriptedFault.step: {self.step!r}; choose from {UPLOAD_STEPS}")
        if self.kind not in (None, "reset_after", "reset", "429", "503"):
            raise ValueError(f"ScriptedFault.kind: {self.kind!r}")
        if self.nth < 1:
            raise ValueError("ScriptedFault.nth counts from 1")


class _Script:
    """Scripted faults plus per-step request counts and a log of ``(step, outcome)`` per upload request."""

    def __init__(self, faults: list[ScriptedFault]) -> None:
        self.faults = list(faults)
        self.counts: Counter = Counter()
        self.uploads: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def take(self, step: str) -> ScriptedFault | None:
        with self._lock:
            self.counts[step] += 1
            for i, fault in enumerate(self.faults):
                if fault.step == step and fault.nth == self.counts[step]:
                    return self.faults.pop(i)
        return None

    def record(self, step: str, outcome: str) -> None:
        with self._lock:
            self.uploads.append((step, outcome))


@dataclass
class _Session:
    bucket: str
    name: str
    create_only: bool
    persisted: int = 0
    finalized: bool = False


class _ResumableShim:
    """Real-GCS behaviour of resumable uploads that fake-gcs-server 1.54 lacks, applied in the proxy:

    * ``ifGenerationMatch=0`` is checked when the session is opened and again at the final chunk: an
      existing object -> 412 (``conditionNotMet``), nothing forwarded (fake-gcs-server ignores it and
      overwrites).
    * A re-sent chunk whose bytes the session already holds is answered 308 with the current ``Range``
      and not forwarded; a partly new one is trimmed (fake-gcs-server appends it again: a corrupt object).
    * A chunk sent to a session that is already finalized gets ``completed_status`` (412, 410 or 404;
      ``None`` forwards it: fake-gcs-server answers 404).
    """

    def __init__(self, upstream: object, completed_status: int | None) -> None:
        self.upstream = upstream
        self.completed_status = completed_status
        self.sessions: dict[str, _Session] = {}
        self.lock = threading.Lock()

    def object_exists(self, bucket: str, name: str) -> bool:
        conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=30)
        try:
            conn.request("GET", f"/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}")
            resp = conn.getresponse()
            resp.read()
            return resp.status == 200
        finally:
            conn.close()

    @staticmethod
    def upload_id(path: str) -> str:
        return parse_qs(urlsplit(path).query).get("upload_id", [""])[0]

    def session(self, path: str) -> _Session | None:
        with self.lock:
            return self.sessions.get(self.upload_id(path))


def _precondition_reply() -> tuple[int, list[tuple[str, str]], bytes]:
    message = "At least one of the pre-conditions you specified did not hold."
    body = json.dumps({"error": {"code": 412, "message": message,
                                 "errors": [{"reason": "conditionNotMet", "message": message}]}}).encode()
    return 412, [("Content-Type", "application/json; charset=UTF-8")], body


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP RST (SO_LINGER on, timeout 0) instead of a clean FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    except OSError:
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _ProxyServer

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        return  # quiet: the stats object is the log

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def handle(self) -> None:
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up on this connection (its own timeout or retry): nothing to do

    def _send(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        if not (self.command == "HEAD" and any(k.lower() == "content-length" for k, _ in headers)):
            self.send_header("Content-Length", str(len(body)))  # a HEAD keeps the upstream's object size
        self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.close_connection = True

    def _error_reply(self, status: int) -> None:
        message = "Too Many Requests (injected)" if status == 429 else "Service Unavailable (injected)"
        style = self.server.decider.plan.error_style
        if style == "gcs":
            body = json.dumps({"error": {"code": status, "message": message, "errors": [
                {"reason": "rateLimitExceeded" if status == 429 else "backendError", "message": message}
            ]}}).encode()
            self._send(status, [("Content-Type", "application/json; charset=UTF-8")], body)
            return
        code = {"s3": "SlowDown", "azure": "ServerBusy"}[style]
        body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                f"<Message>{message}</Message></Error>").encode()
        headers = [("Content-Type", "application/xml")]
        if style == "azure":
            headers.append(("x-ms-error-code", code))
        self._send(status, headers, body)

    def _forward(self, body: bytes, replace: Mapping[str, str] | None = None) -> tuple[int, list[tuple[str, str]], bytes]:
        up = self.server.upstream
        conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
        try:
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers.update(replace or {})
            headers["Host"] = up.netloc
            if body or self.command in ("POST", "PUT", "PATCH"):
                headers["Content-Length"] = str(len(body))
            conn.request(self.command, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
            out_headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP
                           or (self.command == "HEAD" and k.lower() == "content-length")]
            return resp.status, out_headers, data
        finally:
            conn.close()

    def _rewrite(self, headers: list[tuple[str, str]], data: bytes) -> tuple[list[tuple[str, str]], bytes]:
        up, me = self.server.upstream_url, self.server.url
        fixed = [(k, v.replace(up, me) if k.lower() == "location" else v) for k, v in headers]
        ctype = next((v for k, v in headers if k.lower() == "content-type"), "")
        if "json" in ctype and up.encode() in data:
            data = data.replace(up.encode(), me.encode())
        return fixed, data

    def _control(self) -> None:
        decider = self.server.decider
        parts = urlsplit(self.path)
        if parts.path.endswith("/active"):
            decider.active = parse_qs(parts.query).get("on", ["1"])[0] == "1"
        with decider._lock:
            st = decider.stats
            data = {"active": decider.active, "requests": st.requests, "forwarded": st.forwarded,
                    "by_kind": dict(st.by_kind), "log": st.log}
        self._send(200, [("Content-Type", "application/json")], json.dumps(data).encode())

    def _shim_initiate(self, shim: _ResumableShim, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        query = parse_qs(urlsplit(self.path).query)
        bucket = urlsplit(self.path).path.split("/b/", 1)[1].split("/", 1)[0]
        try:
            name = query.get("name", [""])[0] or json.loads(body or b"{}").get("name", "")
        except ValueError:
            name = ""
        create_only = query.get("ifGenerationMatch", [""])[0] == "0"
        if create_only and name and shim.object_exists(bucket, name):
            return _precondition_reply()
        status, headers, data = self._forward(body)
        location = next((v for k, v in headers if k.lower() == "location"), "")
        if status == 200 and location:
            with shim.lock:
                shim.sessions[shim.upload_id(location)] = _Session(bucket, name, create_only)
        return status, headers, data

    def _shim_chunk(self, shim: _ResumableShim, step: str, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        sess = shim.session(self.path)
        if sess is None:
            return self._forward(body)
        if sess.finalized:
            if shim.completed_status is None:
                return self._forward(body)
            if shim.completed_status == 412:
                return _precondition_reply()
            err = {"error": {"code": shim.completed_status, "message": "upload session is finalized (injected)"}}
            return shim.completed_status, [("Content-Type", "application/json")], json.dumps(err).encode()
        match = _RANGE.fullmatch(self.headers.get("Content-Range", "").strip())
        first, last, total = int(match.group(1)), int(match.group(2)), match.group(3)
        replace = None
        if last < sess.persisted:  # all of it is already stored: what GCS answers, without storing it again
            return 308, [("Range", f"bytes=0-{sess.persisted - 1}")], b""
        if first < sess.persisted:
            body = body[sess.persisted - first :]
            replace = {"Content-Range": f"bytes {sess.persisted}-{last}/{total}"}
        if step == "final" and sess.create_only and shim.object_exists(sess.bucket, sess.name):
            return _precondition_reply()
        status, headers, data = self._forward(body, replace)
        with shim.lock:
            if status == 308:
                got = next((v for k, v in headers if k.lower() == "range"), "")
                sess.persisted = int(got.rsplit("-", 1)[1]) + 1 if "-" in got else 0
            elif status in (200, 201):
                sess.finalized = True
        return status, headers, data

    def _handle(self) -> None:
        body = self._read_body()
        if self.path.startswith(_CONTROL):
            self._control()
            return
        server = self.server
        step = upload_step(self.command, self.path, self.headers)
        scripted = server.script.take(step) if step is not None else None
        if scripted is not None and scripted.before is not None:
            scripted.before()
        fault = server.decider.draw(self.command, self.path)
        if scripted is not None:
            fault = scripted.kind
        if fault in ("429", "503"):
            self._record(step, f"injected {fault}")
            self._error_reply(int(fault))
            return
        if fault == "reset":
            self._record(step, "injected reset")
            self.close_connection = True
            _reset(self.connection)
            return
        try:
            if server.shim is not None and step == "initiate":
                status, headers, data = self._shim_initiate(server.shim, body)
            elif server.shim is not None and step in ("middle", "final"):
                status, headers, data = self._shim_chunk(server.shim, step, body)
            else:
                status, headers, data = self._forward(body)
        except OSError as exc:  # upstream down: report it like a gateway would
            self._send(502, [("Content-Type", "text/plain")], f"upstream error: {exc}".encode())
            return
        with server.decider._lock:
            server.decider.stats.forwarded += 1
        if fault == "reset_after":
            self._record(step, f"dropped {status}")
            self.close_connection = True
            _reset(self.connection)
            return
        if fault == "delay":
            time.sleep(server.decider.plan.delay_seconds)
        self._record(step, str(status))
        headers, data = self._rewrite(headers, data)
        self._send(status, headers, data)

    def _record(self, step: str | None, outcome: str) -> None:
        if step is not None:
            self.server.script.record(step, outcome)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _handle


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    upstream: object
    upstream_url: str
    url: str
    decider: _Decider
    script: _Script
    shim: _ResumableShim | None


class FaultProxy:
    """A running fault-injecting proxy on ``127.0.0.1`` in front of ``upstream_url``.

    Args:
        upstream_url: the emulator's base URL, e.g. ``http://127.0.0.1:4443``.
        plan: what to inject at random; ``FaultPlan(rate=0)`` makes a transparent proxy.
        port: port to listen on; 0 picks a free one.
        script: targeted faults (:class:`ScriptedFault`), each used once; they override ``plan``'s draw.
        gcs_resumable: give resumable uploads real GCS's semantics (see :class:`_ResumableShim`).
        completed_status: with ``gcs_resumable``, the status answering a chunk sent to a session that is
            already finalized (412, 410 or 404; ``None``: forwarded, fake-gcs-server answers 404).

    Attributes:
        url: the proxy's base URL (``http://127.0.0.1:<port>``), to use as ``STORAGE_EMULATOR_HOST``.
        stats: :class:`ProxyStats`, live.
        uploads: ``(step, outcome)`` per upload request (:func:`upload_step`), in arrival order; outcome
            is the status sent (``"308"``), ``"dropped <status>"`` or ``"injected <fault>"``.
    """

    def __init__(self, upstream_url: str, plan: FaultPlan | None = None, port: int = 0,
                 script: list[ScriptedFault] | None = None, gcs_resumable: bool = False,
                 completed_status: int | None = None) -> None:
        self.plan = plan or FaultPlan()
        self._server = _ProxyServer(("127.0.0.1", port), _Handler)
        self._server.upstream = urlsplit(upstream_url)
        self._server.upstream_url = upstream_url.rstrip("/")
        self._server.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._server.decider = _Decider(self.plan)
        self._server.script = _Script(script or [])
        self._server.shim = _ResumableShim(self._server.upstream, completed_status) if gcs_resumable else None
        self._thread: threading.Thread | None = None

    @property
    def uploads(self) -> list[tuple[str, str]]:
        return self._server.script.uploads

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def host_port(self) -> str:
        """``127.0.0.1:<port>`` (what pyarrow's ``endpoint_override`` wants)."""
        return self.url.removeprefix("http://")

    @property
    def stats(self) -> ProxyStats:
        return self._server.decider.stats

    @property
    def active(self) -> bool:
        """Whether faults are injected now (``False``: a transparent proxy, e.g. during test set-up)."""
        return self._server.decider.active

    @active.setter
    def active(self, value: bool) -> None:
        self._server.decider.active = value

    def start(self) -> FaultProxy:
        """Serve in a daemon thread; returns ``self``."""
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class FaultProxyProcess:
    """The same proxy in a child process (same interface as :class:`FaultProxy`).

    Use this when the test process itself talks to the proxy through a client that holds the GIL
    while it waits on the network (pyarrow's ``GcsFileSystem.open_input_file`` does): an in-thread proxy
    would then starve until the client times out. Stats and the ``active`` switch go over a control path
    (``/__fault_proxy__/...``) that is never faulted.
    """

    def __init__(self, upstream_url: str, plan: FaultPlan | None = None) -> None:
        self.plan = plan or FaultPlan()
        self.upstream_url = upstream_url
        self._proc: subprocess.Popen | None = None
        self.url = ""

    @property
    def host_port(self) -> str:
        return self.url.removeprefix("http://")

    def _control(self, what: str) -> dict:
        with urllib.request.urlopen(f"{self.url}{_CONTROL}{what}", timeout=10) as resp:
            return json.loads(resp.read())

    @property
    def stats(self) -> ProxyStats:
        data = self._control("stats")
        return ProxyStats(
            requests=data["requests"], forwarded=data["forwarded"], by_kind=Counter(data["by_kind"]),
            log=[tuple(x) for x in data["log"]],
        )

    @property
    def active(self) -> bool:
        return bool(self._control("stats")["active"])

    @active.setter
    def active(self, value: bool) -> None:
        self._control(f"active?on={int(bool(value))}")

    def start(self) -> FaultProxyProcess:
        """Start the child and wait until it prints its URL (raises ``RuntimeError`` if it dies)."""
        cmd = [sys.executable, str(Path(__file__).resolve()), self.upstream_url, json.dumps(asdict(self.plan))]
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        line = self._proc.stdout.readline().strip() if self._proc.stdout else ""
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError(f"fault proxy did not start (printed {line!r})")
        self.url = line
        return self

    def stop(self) -> None:
        """Terminate the child and wait for it."""
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def __enter__(self) -> FaultProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    """Run the proxy standalone: ``python tests/fault_proxy.py UPSTREAM_URL [PLAN_JSON]``.

    Prints the proxy URL on the first stdout line, then serves until terminated.
    """
    upstream = sys.argv[1]
    plan_data = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    if "kinds" in plan_data:
        plan_data["kinds"] = tuple(plan_data["kinds"])
    proxy = FaultProxy(upstream, FaultPlan(**plan_data)).start()
    print(proxy.url, flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            time.sleep(3600)
    finally:
        proxy.stop()


if __name__ == "__main__":
    main()
