"""The Batch inference page's storage guard (run dirs from XCom, shard ids), its run-page link and its
plugin registration (cheap to import, lazy app)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from batch_contract.layout import RunLayout
from batch_inference.ui.guard import (
    PathRefused,
    check_manifest_identity,
    guarded_layout,
    guarded_manifest,
    guarded_shard_id,
)
from batch_inference.ui.lazy import LazyApp
from batch_inference.ui.links import BatchRunPageLink, base_path, run_page_path
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[2]
BUCKET = "gs://bkt/prefix"
DAG = "batch_inference_backfill"
OTHER = "batch_inference_nightly"


@pytest.fixture
def roots(tmp_path: Path) -> list[str]:
    (tmp_path / "allowed" / "runs").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", tmp_path / "allowed" / "escape")
    return [str(tmp_path / "allowed"), BUCKET]


def _ids(run_dir: str) -> tuple[str, str]:
    """The ``(dag_id, run_id)`` a well-formed run dir names (``dag_id`` of an older run dir: the DAG)."""
    parts = run_dir.rstrip("/").split("/")
    return (parts[-2] if parts[-3] == "runs" else DAG), parts[-1]


def test_run_dirs_under_the_roots_are_read(roots: list[str]) -> None:
    local = f"{roots[0]}/runs/{DAG}/manual__2026-01-01T00:00:00+00:00"
    layout = guarded_layout(local, DAG, "manual__2026-01-01T00:00:00+00:00", roots)
    assert (layout.run_dir, layout.dag_id, layout.output_root) == (local, DAG, roots[0])
    assert guarded_layout(f"{roots[0]}/sub/runs/{DAG}/r1", DAG, "r1", roots).run_id == "r1"
    assert guarded_layout(f"file://{roots[0]}/runs/{DAG}/r1", DAG, "r1", roots).dag_id == DAG
    assert guarded_layout(f"{BUCKET}/runs/{DAG}/r1", DAG, "r1", roots).output_root == BUCKET
    assert guarded_layout(f"{BUCKET}/deeper/runs/{DAG}/r1/", DAG, "r1", roots).run_id == "r1"
    older = guarded_layout(f"{roots[0]}/runs/r1", DAG, "r1", roots)    # planned before runs/<dag_id>/
    assert older.dag_id is None and older.run_dir == f"{roots[0]}/runs/r1"


_OUTSIDE = (f" is outside the output roots of DAG '{DAG}' "
            r"\(BATCH_INFERENCE_POLICY or BATCH_INFERENCE_ALLOWED_ROOTS; docs/security\.md\)$")
_NOT_SAFE = " is not a safe path segment"
_NOT_FORM = " is not of the form <output_root>/runs/<dag_id>/<run_id>"
D = DAG


# reason: a regex the refusal must match; {allowed} stands for the allowed local root (regex-escaped)
@pytest.mark.parametrize(("run_dir", "reason"), [
    (f"/etc/runs/{D}/r1", rf"^run dir '/etc/runs/{D}/r1'" + _OUTSIDE),  # another directory
    (f"{{allowed}}/../outside/runs/{D}/r1",                              # climbs out with ..
     rf"^run dir '{{allowed}}/\.\./outside/runs/{D}/r1' \(resolved '[^']*/outside/runs/{D}/r1'\)" + _OUTSIDE),
    (f"{{allowed}}/runs/{D}/..", r"^run_id '\.\.'" + _NOT_SAFE),          # run id ..
    ("{allowed}/runs/..", r"^run_id '\.\.'" + _NOT_SAFE),                # run id .. (older form)
    ("{allowed}/runs/../../outside/runs/x/..", r"^run_id '\.\.'" + _NOT_SAFE),  # run id .. after a climb
    ("{allowed}/runs/../../outside/runs/x/../..",                       # not of the run layout's form
     r"^run dir '{allowed}/runs/\.\./\.\./outside/runs/x/\.\./\.\.'" + _NOT_FORM),
    (f"{{allowed}}/escape/runs/{D}/r1",                                  # a symlink inside the root pointing outside
     rf"^run dir '{{allowed}}/escape/runs/{D}/r1' \(resolved '[^']*/outside/runs/{D}/r1'\)" + _OUTSIDE),
    (f"{{allowed}}/runs/{D}/r1/shards", rf"^run dir '{{allowed}}/runs/{D}/r1/shards'" + _NOT_FORM),
    (f"{{allowed}}/runs/{D}/a%2F..%2F..%2Fetc",                          # encoded slashes stay in the run id: unsafe
     r"^run_id 'a%2F\.\.%2F\.\.%2Fetc'" + _NOT_SAFE),
    (f"{{allowed}}/runs/{D}/r1\x00", rf"^run dir '{{allowed}}/runs/{D}/r1\\x00' is not a path"),
    (f"file:///etc/runs/{D}/r1", rf"^run dir 'file:///etc/runs/{D}/r1' \(resolved '/etc/runs/{D}/r1'\)" + _OUTSIDE),
    (f"gs://other-bucket/runs/{D}/r1", rf"^run dir 'gs://other-bucket/runs/{D}/r1'" + _OUTSIDE),  # another bucket
    (f"gs://bkt/prefix-other/runs/{D}/r1",                               # a sibling prefix, not a sub-prefix
     rf"^run dir 'gs://bkt/prefix-other/runs/{D}/r1'" + _OUTSIDE),
    (f"gs://bkt/prefix/../secret/runs/{D}/r1",                           # .. collapsed in gs:// too
     rf"^run dir 'gs://bkt/prefix/\.\./secret/runs/{D}/r1' \(resolved 'gs://bkt/secret/runs/{D}/r1'\)" + _OUTSIDE),
    (f"oss://bkt/prefix/runs/{D}/r1",                                     # no backend for the scheme
     rf"^run dir 'oss://bkt/prefix/runs/{D}/r1': oss://bkt/prefix/runs/{D}/r1: no storage backend for scheme 'oss'"),
    ("", r"^run dir '' is not a path"),
    # relative: refused, never resolved against the API server's working directory (nor read as /runs/r1)
    ("runs/r1", r"^run dir 'runs/r1' is relative: a run dir is an absolute path or a URI$"),
    (f"out/runs/{D}/r1", rf"^run dir 'out/runs/{D}/r1' is relative"),
    (f"file://out/runs/{D}/r1", rf"^run dir 'file://out/runs/{D}/r1' is relative"),
])
def test_traversal_and_other_roots_are_refused(roots: list[str], run_dir: str, reason: str) -> None:
    with pytest.raises(PathRefused, match=reason.format(allowed=re.escape(roots[0]))):
        guarded_layout(run_dir.format(allowed=roots[0]), DAG, "r1" if "r1" in run_dir else "x", roots)


@pytest.mark.parametrize(("run_dir", "dag_id", "run_id", "reason"), [
    # the run dir of another DAG's run with the same run id (a backfill reusing its run id)
    (f"{{allowed}}/runs/{OTHER}/r1", DAG, "r1", rf"^run dir '[^']*/runs/{OTHER}/r1' is of DAG '{OTHER}', not of '{DAG}'$"),
    # another run of the same DAG
    (f"{{allowed}}/runs/{DAG}/r2", DAG, "r1", r"^run dir '[^']*/r2' is of run 'r2', not of 'r1'$"),
    ("{allowed}/runs/r2", DAG, "r1", r"^run dir '[^']*/runs/r2' is of run 'r2', not of 'r1'$"),
    # the DagRun's own ids are unsafe or carry a trailing newline (matched whole)
    (f"{{allowed}}/runs/{DAG}/r1", DAG, "r1\n", r"^run_id 'r1\\n' is not a safe path segment"),
    (f"{{allowed}}/runs/{DAG}/r1", DAG + "\n", "r1", rf"^dag_id '{DAG}\\n' is not a safe path segment"),
    (f"{{allowed}}/runs/{DAG}/r1", "../x", "r1", r"^dag_id '\.\./x' is not a safe path segment"),
    ("{allowed}/runs/runs/r1", "runs", "r1", r"^dag_id 'runs' is not a safe path segment"),
])
def test_a_run_dir_of_another_run_is_refused(roots: list[str], run_dir: str, dag_id: str, run_id: str,
                                             reason: str) -> None:
    with pytest.raises(PathRefused, match=reason):
        guarded_layout(run_dir.format(allowed=roots[0]), dag_id, run_id, roots)


def test_default_roots_come_from_the_allow_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BATCH_INFERENCE_POLICY", raising=False)
    monkeypatch.setenv("BATCH_INFERENCE_ALLOWED_ROOTS", f"{tmp_path},{BUCKET}")
    assert guarded_layout(f"{tmp_path}/runs/{DAG}/r1", DAG, "r1").run_id == "r1"
    with pytest.raises(PathRefused, match=rf"^run dir '/var/runs/{DAG}/r1' is outside the output roots of DAG '{DAG}'"):
        guarded_layout(f"/var/runs/{DAG}/r1", DAG, "r1")


def test_default_roots_are_the_dags_output_roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a policy file each DAG's run dirs must lie under its own output roots: a run dir under another
    DAG's (another team's) output root is refused; an unreadable policy refuses everything."""
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"dags": {DAG: {"output_roots": [str(mine)]},
                                           OTHER: {"output_roots": [str(theirs)]}}}))
    monkeypatch.setenv("BATCH_INFERENCE_POLICY", str(policy))
    assert guarded_layout(f"{mine}/runs/{DAG}/r1", DAG, "r1").output_root == str(mine)
    assert guarded_layout(f"{theirs}/runs/{OTHER}/r1", OTHER, "r1").output_root == str(theirs)
    with pytest.raises(PathRefused, match=rf"^run dir '{re.escape(str(theirs))}/runs/{DAG}/r1' is outside the "
                       rf"output roots of DAG '{DAG}'"):
        guarded_layout(f"{theirs}/runs/{DAG}/r1", DAG, "r1")
    policy.write_text("{not json")
    with pytest.raises(PathRefused, match=r"^run dir '[^']*': BATCH_INFERENCE_POLICY: cannot read the policy file"):
        guarded_layout(f"{mine}/runs/{DAG}/r1", DAG, "r1")


def _layout(dag_id: str | None) -> RunLayout:
    return RunLayout("/data", "r1", dag_id)


@pytest.mark.parametrize(("layout", "manifest_run_id", "params", "reason"), [
    (_layout(DAG), "r2", {"dag_id": DAG}, r"^the manifest in '/data/runs/[^']*' is of run 'r2', not of 'r1'$"),
    (_layout(DAG), "r1\n", {}, r"^the manifest in '/data/runs/[^']*' is of run 'r1\\n', not of 'r1'$"),
    (_layout(DAG), "r1", {"dag_id": OTHER}, rf"^the manifest in '/data/runs/{DAG}/r1' is of DAG '{OTHER}', not of '{DAG}'$"),
    (_layout(None), "r1", {"dag_id": OTHER}, rf"^the manifest in '/data/runs/r1' is of DAG '{OTHER}', not of '{DAG}'$"),
    (_layout(DAG), "r1", {"dag_id": 7}, rf"is of DAG 7, not of '{DAG}'$"),
    # an older run dir names no DAG: its manifest must
    (_layout(None), "r1", {}, r"^neither run dir '/data/runs/r1' nor its manifest \(params\.dag_id\) names the DAG"),
    (_layout(None), "r1", None, r"^neither run dir '/data/runs/r1' nor its manifest"),
])
def test_a_manifest_of_another_run_or_dag_is_refused(layout: RunLayout, manifest_run_id: str, params, reason: str) -> None:
    with pytest.raises(PathRefused, match=reason):
        check_manifest_identity(layout, DAG, "r1", manifest_run_id, params)


def test_the_manifest_of_the_run_is_accepted() -> None:
    check_manifest_identity(_layout(DAG), DAG, "r1", "r1", {"dag_id": DAG})
    check_manifest_identity(_layout(DAG), DAG, "r1", "r1", {})           # the run dir names the DAG
    check_manifest_identity(_layout(None), DAG, "r1", "r1", {"dag_id": DAG})
    data = json.dumps({"run_id": "r1", "params": {"dag_id": DAG}}).encode()
    assert guarded_manifest(data, _layout(DAG), DAG, "r1") is data


@pytest.mark.parametrize(("data", "reason"), [
    (b"not json", r"^the manifest in '/data/runs/[^']*' is not a JSON object"),
    (b"[1, 2]", r"is not a JSON object: whose run it is is unknown$"),
    (json.dumps({"run_id": "r1", "params": {"dag_id": OTHER}}).encode(), rf"is of DAG '{OTHER}', not of '{DAG}'$"),
    (json.dumps({"params": {"dag_id": DAG}}).encode(), r"is of run None, not of 'r1'$"),
])
def test_a_served_manifest_is_checked_as_served(data: bytes, reason: str) -> None:
    with pytest.raises(PathRefused, match=reason):
        guarded_manifest(data, _layout(DAG), DAG, "r1")


_DAG_IDS = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,12}", fullmatch=True).filter(
    lambda d: ".." not in d and d != "runs")
_RUN_IDS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:+-]{0,12}", fullmatch=True).filter(lambda r: ".." not in r)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.tuples(_DAG_IDS, _RUN_IDS), st.tuples(_DAG_IDS, _RUN_IDS), st.booleans())
def test_a_run_dir_is_read_only_for_its_own_ids(roots: list[str], named: tuple[str, str], asked: tuple[str, str],
                                                same: bool) -> None:
    """Property: ``<root>/runs/<d>/<r>`` passes for the DagRun ``(d, r)`` and is refused for every other."""
    dag_id, run_id = named if same else asked
    run_dir = f"{roots[0]}/runs/{named[0]}/{named[1]}"
    if (dag_id, run_id) == named:
        assert guarded_layout(run_dir, dag_id, run_id, roots).run_dir == run_dir
    else:
        with pytest.raises(PathRefused, match=r"^run dir '[^']*' is of (DAG|run) '[^']*', not of '"):
            guarded_layout(run_dir, dag_id, run_id, roots)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_DAG_IDS, _RUN_IDS, st.sampled_from(["\n", "\r\n", " ", "/..", "/", "\x00", "\t", "\u2028"]),
       st.booleans())
def test_ids_are_matched_whole(roots: list[str], dag_id: str, run_id: str, tail: str, on_dag: bool) -> None:
    """Property: a DagRun id with anything after a safe id (a trailing newline included) is refused, even
    when its run dir is the safe id's."""
    run_dir = f"{roots[0]}/runs/{dag_id}/{run_id}"
    ids = (dag_id + tail, run_id) if on_dag else (dag_id, run_id + tail)
    with pytest.raises(PathRefused, match=r"^(dag_id|run_id) '[^\n]*' is not a safe path segment"):
        guarded_layout(run_dir, *ids, roots)


@pytest.mark.parametrize("shard", ["../00001", "0001", "00001/..", "%2e%2e", "000001", "", "0000a", "00001\n",
                                   "\u0660\u0661\u0662\u0663\u0664"])
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
