"""The test OTLP receiver (``tests/otlp_receiver.py``) decodes what the real OpenTelemetry SDK exporter
sends (plain and gzip), refuses what a collector would refuse, and works as a script."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from otlp_receiver import OtlpReceiver, format_point

RECEIVER = Path(__file__).resolve().parents[1] / "otlp_receiver.py"


def _export(endpoint: str, compression: Compression = Compression.NoCompression) -> None:
    """Export one gauge (two attribute sets), one counter and one histogram through the SDK's OTLP/HTTP
    exporter, as Airflow's OTel logger does, then shut the provider down (final flush)."""
    reader = PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=endpoint, compression=compression),
                                           export_interval_millis=60_000)
    provider = MeterProvider(resource=Resource.create({"service.name": "probe"}), metric_readers=[reader])
    meter = provider.get_meter("probe")
    gauge = meter.create_gauge("airflow.probe.rows_done")
    gauge.set(140, attributes={"dag_id": "d", "shard_id": "00000"})
    gauge.set(2.5, attributes={"dag_id": "d", "shard_id": "00001"})
    meter.create_counter("airflow.probe.count").add(3, attributes={"reason": "empty_text"})
    meter.create_histogram("airflow.probe.ms").record(12.0)
    provider.shutdown()


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip])
def test_decodes_what_the_sdk_exports(compression: Compression) -> None:
    with OtlpReceiver() as rx:
        _export(rx.endpoint, compression)
        assert rx.wait_for(lambda r: {"airflow.probe.rows_done", "airflow.probe.count"} <= r.names(), timeout=10)
    assert rx.errors == [] and rx.requests >= 1
    assert {k: p.value for k, p in rx.series("airflow.probe.rows_done").items()} == {
        (("dag_id", "d"), ("shard_id", "00000")): 140, (("dag_id", "d"), ("shard_id", "00001")): 2.5}
    point = rx.latest("airflow.probe.rows_done", shard_id="00000")
    assert point.kind == "gauge" and point.resource["service.name"] == "probe" and point.time_unix_nano > 0
    assert format_point(point) == "airflow.probe.rows_done 140 {dag_id=d, shard_id=00000}"
    count = rx.latest("airflow.probe.count")
    assert (count.kind, count.value, count.monotonic, count.attributes) == ("sum", 3, True, {"reason": "empty_text"})
    histogram = rx.latest("airflow.probe.ms")
    assert (histogram.kind, histogram.value, histogram.count) == ("histogram", 12.0, 1)
    assert rx.latest("airflow.probe.rows_done", shard_id="00009") is None


def _post(url: str, body: bytes, content_type: str) -> int:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_refuses_other_paths_json_and_garbage() -> None:
    with OtlpReceiver() as rx:
        base = f"http://127.0.0.1:{rx.port}"
        assert _post(f"{base}/v1/traces", b"", "application/x-protobuf") == 404
        assert _post(rx.endpoint, b"{}", "application/json") == 415
        assert _post(rx.endpoint, b"\xff\xff\xff", "application/x-protobuf") == 400
    assert len(rx.errors) == 3 and rx.points() == [] and rx.requests == 0


def test_runs_as_a_script_and_prints_each_point() -> None:
    proc = subprocess.Popen([sys.executable, str(RECEIVER), "--port", "0", "--prefix", "airflow.probe.rows",
                             "--exit-after", "60"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith("# OTLP/HTTP metrics receiver listening on http://127.0.0.1:"), first
        _export(first.split()[-1])
        lines = [proc.stdout.readline().strip() for _ in range(2)]
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert sorted(lines) == ["airflow.probe.rows_done 140 {dag_id=d, shard_id=00000}",
                             "airflow.probe.rows_done 2.5 {dag_id=d, shard_id=00001}"]
    assert "# received 2 point(s) of 1 metric(s)" in out and "airflow.probe.rows_done: 2 point(s)" in out, out + err
