"""A small OTLP/HTTP metrics receiver for tests and hand checks: what an OpenTelemetry Collector would get.

It listens on ``127.0.0.1`` (a free port by default), accepts ``POST /v1/metrics`` with an OTLP protobuf
body (``application/x-protobuf``; ``Content-Encoding: gzip`` or ``deflate`` accepted), decodes it with
``opentelemetry-proto`` (``ExportMetricsServiceRequest``) and records every data point: metric name,
kind, value, attributes, time and the sender's resource attributes. It answers as a collector does (an
empty ``ExportMetricsServiceResponse``); anything else gets 404 (path) or 415 (not protobuf) or 400 (an
undecodable body, recorded in :attr:`OtlpReceiver.errors`).

As a context manager (tests)::

    with OtlpReceiver() as rx:
        env["AIRFLOW__METRICS__OTEL_PORT"] = str(rx.port)
        ...  # run something that exports metrics
        rx.wait_for(lambda r: "airflow.batch_inference.run.rows_done" in r.names(), timeout=30)
        point = rx.latest("airflow.batch_inference.run.rows_done", stage="report")

As a script (hand checks): ``python tests/otlp_receiver.py --port 4318`` prints one line per data point
received (``name value {attributes}``; ``--json`` for JSON lines, ``--prefix`` to keep only names that
start with it) until interrupted (or ``--exit-after`` seconds), then a summary of the names seen.
"""

from __future__ import annotations

import argparse
import gzip
import json
import signal
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

METRICS_PATH = "/v1/metrics"
PROTOBUF = "application/x-protobuf"


@dataclass(frozen=True)
class Point:
    """One data point as received.

    Attributes:
        name: the metric name as sent (with the sender's prefix, e.g. ``airflow.``).
        kind: ``gauge``, ``sum``, ``histogram``, ``exponential_histogram`` or ``summary``.
        value: the point's value (gauge/sum: the number; histograms and summaries: their ``sum``).
        attributes: the point's attributes, decoded to Python values.
        time_unix_nano: the point's timestamp (nanoseconds since the epoch).
        resource: the sender's resource attributes (``service.name``, ...).
        count: observations in a histogram or summary point; ``None`` for gauges and sums.
        monotonic: ``sum`` points only: whether the sum is monotonic (a counter).
        received_at: this receiver's clock when the request arrived (seconds since the epoch).
    """

    name: str
    kind: str
    value: float
    attributes: dict[str, Any]
    time_unix_nano: int
    resource: dict[str, Any] = field(default_factory=dict)
    count: int | None = None
    monotonic: bool | None = None
    received_at: float = 0.0


def any_value(value: Any) -> Any:
    """An OTLP ``AnyValue`` as a Python value (arrays as lists, key-value lists as dicts)."""
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, which)


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: any_value(kv.value) for kv in kvs}


def _number(dp: Any) -> float:
    return dp.as_double if dp.WhichOneof("value") == "as_double" else float(dp.as_int)


def decode_request(body: bytes, received_at: float | None = None) -> list[Point]:
    """The data points of one serialized ``ExportMetricsServiceRequest``.

    Raises:
        google.protobuf.message.DecodeError: ``body`` is not such a message.
    """
    request = ExportMetricsServiceRequest()
    request.ParseFromString(body)
    now = time.time() if received_at is None else received_at
    points: list[Point] = []
    for rm in request.resource_metrics:
        resource = _attributes(rm.resource.attributes)
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                if kind is None:
                    continue
                data = getattr(metric, kind)
                monotonic = data.is_monotonic if kind == "sum" else None
                for dp in data.data_points:
                    if kind in {"gauge", "sum"}:
                        value, count = _number(dp), None
                    else:
                        value, count = float(dp.sum), int(dp.count)
                    points.append(Point(name=metric.name, kind=kind, value=value,
                                        attributes=_attributes(dp.attributes), time_unix_nano=int(dp.time_unix_nano),
                                        resource=resource, count=count, monotonic=monotonic, received_at=now))
    return points


def _decompress(body: bytes, encoding: str) -> bytes:
    """The body as sent before ``Content-Encoding`` (``gzip``, ``deflate`` or none).

    Raises:
        ValueError: an unknown encoding, or a body that does not decompress.
    """
    encoding = encoding.strip().lower()
    try:
        if encoding in {"", "identity"}:
            return body
        if encoding == "gzip":
            return gzip.decompress(body)
        if encoding == "deflate":
            return zlib.decompress(body)
    except (OSError, zlib.error) as exc:
        raise ValueError(f"body does not decompress as {encoding}: {exc}") from exc
    raise ValueError(f"unsupported Content-Encoding {encoding!r}")


class OtlpReceiver:
    """The receiver: an HTTP server on a thread, the points it received, and waits on them.

    Args:
        host: address to listen on (default ``127.0.0.1``: nothing outside the machine can send).
        port: TCP port; ``0`` (default) picks a free one (read :attr:`port` after :meth:`start`).
        on_points: called (on the server's thread) with the points of each request as they arrive.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 on_points: Callable[[list[Point]], None] | None = None) -> None:
        self.host = host
        self._requested_port = port
        self._on_points = on_points
        self._points: list[Point] = []
        self.requests = 0
        """Export requests decoded (each answered 200)."""
        self.errors: list[str] = []
        """Why each refused request was refused (path, content type, undecodable body)."""
        self._cond = threading.Condition(threading.RLock())
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life cycle ----------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        """The port listened on (raises ``RuntimeError`` before :meth:`start`)."""
        if self._server is None:
            raise RuntimeError("OtlpReceiver: not started")
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        """``http://<host>:<port>/v1/metrics`` (what ``OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`` would be)."""
        return f"http://{self.host}:{self.port}{METRICS_PATH}"

    def start(self) -> OtlpReceiver:
        """Bind and serve on a daemon thread; returns ``self``.

        Raises:
            OSError: the port cannot be bound (e.g. already in use).
        """
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                receiver._handle(self)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (signature of the base)
                return

        self._server = ThreadingHTTPServer((self.host, self._requested_port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket (points received stay readable)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the HTTP side -------------------------------------------------------------------------------
    def _refuse(self, handler: BaseHTTPRequestHandler, code: int, why: str) -> None:
        with self._cond:
            self.errors.append(why)
        body = why.encode()
        handler.send_response(code)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length > 0 else b""
        if handler.path.split("?", 1)[0] != METRICS_PATH:
            self._refuse(handler, 404, f"POST {handler.path}: only {METRICS_PATH} is served")
            return
        ctype = (handler.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if ctype != PROTOBUF:
            self._refuse(handler, 415, f"Content-Type {ctype!r}: only {PROTOBUF} (OTLP/HTTP protobuf)")
            return
        try:
            points = decode_request(_decompress(raw, handler.headers.get("Content-Encoding") or ""))
        except (ValueError, DecodeError) as exc:
            self._refuse(handler, 400, f"undecodable OTLP body: {exc}")
            return
        with self._cond:
            self._points.extend(points)
            self.requests += 1
            self._cond.notify_all()
        if self._on_points is not None:
            self._on_points(points)
        body = ExportMetricsServiceResponse().SerializeToString()
        handler.send_response(200)
        handler.send_header("Content-Type", PROTOBUF)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    # -- reading what arrived ------------------------------------------------------------------------
    def points(self, name: str | None = None, **attributes: Any) -> list[Point]:
        """Points received so far, oldest first; only those named ``name`` and carrying every given
        attribute value (values compared as strings) when given."""
        with self._cond:
            found = list(self._points)
        return [p for p in found if (name is None or p.name == name) and _has(p, attributes)]

    def names(self) -> set[str]:
        """Every metric name received so far."""
        return {p.name for p in self.points()}

    def latest(self, name: str, **attributes: Any) -> Point | None:
        """The newest point (by its timestamp, then arrival) of ``name`` with those attributes, or ``None``."""
        found = self.points(name, **attributes)
        return max(found, key=lambda p: p.time_unix_nano) if found else None

    def series(self, name: str, **attributes: Any) -> dict[tuple[tuple[str, str], ...], Point]:
        """The newest point of each attribute set of ``name`` (key: sorted ``(attribute, str(value))``
        pairs)."""
        out: dict[tuple[tuple[str, str], ...], Point] = {}
        for p in sorted(self.points(name, **attributes), key=lambda p: p.time_unix_nano):
            out[tuple(sorted((k, str(v)) for k, v in p.attributes.items()))] = p
        return out

    def wait_for(self, condition: Callable[[OtlpReceiver], bool], timeout: float = 30.0) -> bool:
        """Block until ``condition(self)`` holds (checked on every request) or ``timeout`` seconds
        pass; returns whether it held."""
        deadline = time.monotonic() + timeout
        with self._cond:  # an RLock: condition() may read the points while it is held
            while not condition(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(timeout=min(left, 0.5))
            return True


def _has(point: Point, attributes: dict[str, Any]) -> bool:
    return all(str(point.attributes.get(k)) == str(v) for k, v in attributes.items())


def format_point(point: Point) -> str:
    """``name value {attributes}`` (one line, attributes sorted)."""
    attrs = ", ".join(f"{k}={v}" for k, v in sorted(point.attributes.items()))
    value = f"{point.value:.6g}" if isinstance(point.value, float) else str(point.value)
    return f"{point.name} {value} {{{attrs}}}"


def _print_points(points: list[Point], prefix: str, as_json: bool) -> None:
    for p in points:
        if not p.name.startswith(prefix):
            continue
        print(json.dumps(asdict(p), sort_keys=True, default=str) if as_json else format_point(p), flush=True)


def _summary(points: list[Point], prefix: str) -> Iterator[str]:
    names: dict[str, int] = {}
    for p in points:
        if p.name.startswith(prefix):
            names[p.name] = names.get(p.name, 0) + 1
    yield f"# received {sum(names.values())} point(s) of {len(names)} metric(s)"
    for name in sorted(names):
        yield f"#   {name}: {names[name]} point(s)"


def main(argv: list[str] | None = None) -> int:
    """The script: listen, print points as they arrive, print a summary on exit."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4318, help="TCP port (0: a free one; printed)")
    parser.add_argument("--prefix", default="", help="print only metrics whose name starts with this")
    parser.add_argument("--json", action="store_true", help="one JSON object per point")
    parser.add_argument("--exit-after", type=float, default=0.0, help="stop after this many seconds (0: never)")
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    rx = OtlpReceiver(args.host, args.port, on_points=lambda pts: _print_points(pts, args.prefix, args.json))
    with rx:
        print(f"# OTLP/HTTP metrics receiver listening on {rx.endpoint}", flush=True)
        try:
            stop.wait(args.exit_after if args.exit_after > 0 else None)
        except KeyboardInterrupt:
            pass
    for line in _summary(rx.points(), args.prefix):
        print(line, flush=True)
    for why in rx.errors:
        print(f"# refused: {why}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
