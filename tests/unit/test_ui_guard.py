"""The Batch inference page's storage guard (run dirs from XCom, shard ids), its run-page link and its
plugin registration (cheap to import, lazy app)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from batch_inference.ui.guard import PathRefused, guarded_layout, guarded_shard_id
from batch_inference.ui.lazy import LazyApp
from batch_inference.ui.links import BatchRunPageLink, base_path, run_page_path

REPO = Path(__file__).resolve().parents[2]
BUCKET = "gs://bkt/prefix"


@pytest.fixture
def roots(tmp_path: Path) -> list[str]:
    (tmp_path / "allowed" / "runs").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", tmp_path / "allowed" / "escape")
    return [str(tmp_path / "allowed"), BUCKET]


def test_run_dirs_under_the_roots_are_read(roots: list[str]) -> None:
    local = f"{roots[0]}/runs/manual__2026-01-01T00:00:00+00:00"
    assert guarded_layout(local, roots).run_dir == local
    assert guarded_layout(f"{roots[0]}/sub/runs/r1", roots).run_id == "r1"
    assert guarded_layout(f"{BUCKET}/runs/r1", roots).output_root == BUCKET
    assert guarded_layout(f"{BUCKET}/deeper/runs/r1/", roots).run_id == "r1"


_OUTSIDE = " is outside the allowed roots"
_NOT_SAFE = " is not a safe path segment"
_NOT_FORM = " is not of the form <output_root>/runs/<run_id>"


# reason: a regex the refusal must match; {allowed} stands for the allowed local root (regex-escaped)
@pytest.mark.parametrize(("run_dir", "reason"), [
    ("/etc/runs/r1", r"^params\.run_dir: '/etc/runs/r1'" + _OUTSIDE),  # another directory
    ("{allowed}/../outside/runs/r1",                                    # climbs out with ..
     r"^params\.run_dir: '{allowed}/\.\./outside/runs/r1' \(resolved '[^']*/outside/runs/r1'\)" + _OUTSIDE),
    ("{allowed}/runs/..", r"^run_id '\.\.'" + _NOT_SAFE),              # run id ..
    ("{allowed}/runs/../../outside/runs/x/..",                          # run id .. after a climb
     r"^run dir '{allowed}/runs/\.\./\.\./outside/runs/x/\.\.'" + _NOT_FORM),
    ("{allowed}/escape/runs/r1",                                        # a symlink inside the root pointing outside
     r"^params\.run_dir: '{allowed}/escape/runs/r1' \(resolved '[^']*/outside/runs/r1'\)" + _OUTSIDE),
    ("{allowed}/runs/r1/shards", r"^run dir '{allowed}/runs/r1/shards'" + _NOT_FORM),  # not <root>/runs/<run_id>
    ("{allowed}/runs/a%2F..%2F..%2Fetc",                                # encoded slashes stay in the run id: unsafe
     r"^run_id 'a%2F\.\.%2F\.\.%2Fetc'" + _NOT_SAFE),
    ("{allowed}/runs/r1\x00", r"^run dir '{allowed}/runs/r1\\x00' is not a path"),
    ("file:///etc/runs/r1", r"^params\.run_dir: 'file:///etc/runs/r1' \(resolved '/etc/runs/r1'\)" + _OUTSIDE),
    ("gs://other-bucket/runs/r1", r"^params\.run_dir: 'gs://other-bucket/runs/r1'" + _OUTSIDE),  # another bucket
    ("gs://bkt/prefix-other/runs/r1",                                   # a sibling prefix, not a sub-prefix
     r"^params\.run_dir: 'gs://bkt/prefix-other/runs/r1'" + _OUTSIDE),
    ("gs://bkt/prefix/../secret/runs/r1",                               # .. collapsed in gs:// too
     r"^params\.run_dir: 'gs://bkt/prefix/\.\./secret/runs/r1' \(resolved 'gs://bkt/secret/runs/r1'\)" + _OUTSIDE),
    ("s3://bkt/prefix/runs/r1",                                         # no backend for the scheme
     r"^params\.run_dir: s3://bkt/prefix/runs/r1: no storage backend for scheme 's3'"),
    ("", r"^run dir '' is not a path"),
    ("runs/r1", r"^params\.run_dir: '/runs/r1'" + _OUTSIDE),          # relative: checked as <output_root ''>/runs/r1
])
def test_traversal_and_other_roots_are_refused(roots: list[str], run_dir: str, reason: str) -> None:
    with pytest.raises(PathRefused, match=reason.format(allowed=re.escape(roots[0]))):
        guarded_layout(run_dir.format(allowed=roots[0]), roots)


def test_default_roots_come_from_the_allow_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCH_INFERENCE_ALLOWED_ROOTS", f"{tmp_path},{BUCKET}")
    assert guarded_layout(f"{tmp_path}/runs/r1").run_id == "r1"
    with pytest.raises(PathRefused, match=r"^params\.run_dir: '/var/runs/r1' is outside the allowed roots"):
        guarded_layout("/var/runs/r1")


@pytest.mark.parametrize("shard", ["../00001", "0001", "00001/..", "%2e%2e", "000001", "", "0000a"])
def test_shard_ids_must_be_five_digits(shard: str) -> None:
    with pytest.raises(PathRefused, match=f"^shard id {re.escape(repr(shard))} is not five digits"):
        guarded_shard_id(shard)
    assert guarded_shard_id("00042") == "00042"


def _op(task_id: str, tags: list[str]) -> SimpleNamespace:
    return SimpleNamespace(task_id=task_id, dag=SimpleNamespace(tags=tags))


def test_run_page_link_on_publish_and_summary_only() -> None:
    link = BatchRunPageLink()
    key = SimpleNamespace(dag_id="batch_inference_backfill", run_id="manual__2026-01-01T00:00:00+00:00")
    url = link.get_link(_op("summary", ["batch-inference", "backfill"]), ti_key=key)
    assert url == "/batch-inference/runs/batch_inference_backfill/manual__2026-01-01T00%3A00%3A00%2B00%3A00"
    assert link.get_link(_op("publish", ["batch-inference"]), ti_key=key) == url
    assert link.get_link(_op("plan", ["batch-inference"]), ti_key=key) == ""
    assert link.get_link(_op("summary", ["other"]), ti_key=key) == ""
    assert link.name == "Batch inference run"


def test_link_paths_follow_the_base_url() -> None:
    assert base_path("http://host:8080/airflow/") == "/airflow"
    assert base_path("") == ""
    assert run_page_path("d", "a/b", "https://x/af") == "/af/batch-inference/runs/d/a%2Fb"


def test_lazy_app_builds_once_on_first_call() -> None:
    calls: list[tuple] = []

    async def asgi(scope, receive, send):
        calls.append((scope["type"], receive, send))

    app = LazyApp("test_ui_guard:_factory")
    _FACTORY_CALLS.clear()
    _FACTORY_APP.append(asgi)
    asyncio.run(app({"type": "http"}, 1, 2))
    asyncio.run(app({"type": "http"}, 3, 4))
    assert calls == [("http", 1, 2), ("http", 3, 4)] and len(_FACTORY_CALLS) == 1
    with pytest.raises(ValueError, match="^LazyApp target 'no_colon' is not 'module:function'"):
        LazyApp("no_colon")


_FACTORY_CALLS: list[int] = []
_FACTORY_APP: list = []


def _factory():
    _FACTORY_CALLS.append(1)
    return _FACTORY_APP[-1]


def test_plugin_registers_cheaply() -> None:
    """Importing the plugin (what every Airflow component does) loads no web framework, template engine,
    ORM model or pyarrow, and declares the app, the nav entry and the link."""
    script = textwrap.dedent("""
        import json, sys
        import airflow.plugins_manager, airflow.sdk
        before = set(sys.modules)
        import batch_inference_ui
        p = batch_inference_ui.BatchInferencePlugin
        new = sorted(set(sys.modules) - before)
        print("RESULT " + json.dumps({"new": new, "apps": [a["url_prefix"] for a in p.fastapi_apps],
              "views": p.external_views, "links": [l.name for l in p.global_operator_extra_links]}))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO / "worker_image")])}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert out.returncode == 0 and line, out.stderr[-2000:]
    import json

    result = json.loads(line[-1][7:])
    heavy = [m for m in result["new"] if m.split(".")[0] in {"fastapi", "starlette", "jinja2", "pyarrow", "sqlalchemy"}
             or m.startswith(("airflow.models", "airflow.api_fastapi", "batch_inference.ui.app",
                              "batch_inference.report", "batch_contract.storage"))]
    assert heavy == [], heavy
    assert result["apps"] == ["/batch-inference"]
    assert result["views"][0]["destination"] == "nav" and result["views"][0]["href"] == "/batch-inference/"
    assert result["links"] == ["Batch inference run"]
