"""Who approved a run and when, in the cost report (``report.json``, HTML, Markdown and text summaries) and
on the UI's run page, from the run's ``approval.json`` (``batch_inference.report.approvals``).

The class of defect: a run's record of who answered its approval request (and when) was shown nowhere
after the fact. Properties over generated records (any decision, user, time, a hostile or odd name,
junk): the section always fits the report schema, names the person who answered and the time, never
names anybody for an unanswered request, and renders escaped. Then the real report build and the real
UI app over synthetic runs, with and without approval.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import test_report as synthetic
from batch_contract import storage
from batch_inference.approval import write_approval
from batch_inference.report import build_report, markdown_summary, text_summary, validate_report
from batch_inference.report.approvals import NOT_REQUIRED, approval_section, approval_text, one_line, who
from batch_inference.report.page import render_html
from batch_inference.report.schema import load_schema
from hypothesis import given, settings
from hypothesis import strategies as st
from ui.app_harness import DAG, RUN, UiHarness, allow_only, make_run, record, run_path

SECTION_SCHEMA = load_schema()["properties"]["approval"]
ALICE = {"id": "7", "name": "Alice <b>Smith</b>"}

names = st.one_of(st.none(), st.just(""), st.text(min_size=1, max_size=40))
users = st.one_of(st.none(), st.fixed_dictionaries({"id": st.one_of(names, st.integers(0, 10**6)), "name": names}))
times = st.one_of(st.none(), st.datetimes().map(lambda d: d.isoformat()))
records = st.fixed_dictionaries({
    "decision": st.sampled_from(["pending", "approved", "rejected"]),
    "asked_at": times, "wait_seconds": st.floats(0, 1e6), "responded_by": users, "responded_at": times,
    "timed_out": st.booleans(), "projection": st.just({"cost_usd": 0.01}),
})
junk = st.one_of(st.none(), st.integers(), st.text(max_size=10), st.lists(st.integers(), max_size=2),
                 st.dictionaries(st.text(max_size=8), st.integers(), max_size=3))


@settings(max_examples=300, deadline=None)
@given(records)
def test_every_record_gives_a_schema_valid_section_naming_who_answered_and_when(rec: dict[str, Any]) -> None:
    section = approval_section(rec)
    jsonschema.Draft202012Validator(SECTION_SCHEMA).validate(section)
    assert section["decision"] == rec["decision"] and section["timed_out"] == rec["timed_out"]
    text = approval_text(section)
    assert text.startswith(rec["decision"]) and text.isprintable()
    if rec["decision"] == "pending":
        assert text.startswith("pending: asked at")
    elif rec["timed_out"]:
        assert section["responded_by"] is None and "nobody answered" in text
    else:
        assert f" by {who(section['responded_by'])} at " in text
        if rec["responded_at"]:
            assert text.endswith(f" at {one_line(rec['responded_at'])}")
        user = rec["responded_by"] or {}
        for part in ("name", "id"):
            if user.get(part) not in (None, ""):
                assert one_line(user[part]) in text


@settings(max_examples=100, deadline=None)
@given(junk)
def test_a_record_that_is_not_an_approval_is_unreadable_never_an_error(rec: Any) -> None:
    section = approval_section(rec)
    if rec is None:
        assert section is None and approval_text(section) == NOT_REQUIRED
        return
    jsonschema.Draft202012Validator(SECTION_SCHEMA).validate(section)
    assert section["decision"] == "unreadable" and approval_text(section) == "approval.json unreadable"


# -- the report, built from a synthetic run (tests/unit/test_report.py) -----------------------------------


def _approved(run_dir: str) -> None:
    write_approval(run_dir, {"decision": "approved", "asked_at": "2026-11-30T00:59:00+00:00", "wait_seconds": 3600.0,
                             "responded_by": ALICE, "responded_at": "2026-11-30T01:00:02+00:00", "timed_out": False,
                             "projection": {"cost_usd": 0.01}})


def test_the_report_names_who_approved_and_when_in_every_form(tmp_path: Path) -> None:
    layout = synthetic.make_run(tmp_path)
    _approved(layout.run_dir)
    r = build_report(layout.run_dir, dag_id=synthetic.DAG_ID, publish_summary=synthetic.PUBLISH,
                     cost_params=synthetic.COST)
    validate_report(r)
    assert r["approval"] == {"decision": "approved", "responded_by": ALICE, "responded_at": "2026-11-30T01:00:02+00:00",
                             "asked_at": "2026-11-30T00:59:00+00:00", "timed_out": False}
    line = "approved by Alice <b>Smith</b> (id 7) at 2026-11-30T01:00:02+00:00"
    assert json.loads(Path(layout.report_json_uri).read_text())["approval"] == r["approval"]
    assert f"| approval | {line} |" in markdown_summary(r)
    assert any(row.split(None, 1)[0] == "approval" and row.endswith(line) for row in text_summary(r).splitlines()
               if row.strip())
    page = Path(layout.report_html_uri).read_text()
    assert ('<p class="note" id="approval">Approval: approved by Alice &lt;b&gt;Smith&lt;/b&gt; (id 7) at '
            "2026-11-30T01:00:02+00:00</p>") in page


def test_a_run_without_approval_says_not_required_and_an_unreadable_record_says_so(tmp_path: Path) -> None:
    layout = synthetic.make_run(tmp_path)
    r = build_report(layout.run_dir, dag_id=synthetic.DAG_ID, publish_summary=synthetic.PUBLISH,
                     cost_params=synthetic.COST)
    validate_report(r)
    assert r["approval"] is None
    assert "| approval |" not in markdown_summary(r)
    assert not any(row.split()[:1] == ["approval"] for row in text_summary(r).splitlines())
    assert '<p class="note" id="approval">Approval: not required</p>' in Path(layout.report_html_uri).read_text()
    storage.write_replace(f"{layout.run_dir}/approval.json", b"{not json")
    r = build_report(layout.run_dir, dag_id=synthetic.DAG_ID, publish_summary=synthetic.PUBLISH,
                     cost_params=synthetic.COST, write_html=False)
    validate_report(r)
    assert r["approval"]["decision"] == "unreadable"
    assert "Approval: approval.json unreadable" in render_html(r)


def test_a_report_written_before_approvals_were_recorded_still_validates(tmp_path: Path) -> None:
    layout = synthetic.make_run(tmp_path)
    r = build_report(layout.run_dir, dag_id=synthetic.DAG_ID, publish_summary=synthetic.PUBLISH,
                     cost_params=synthetic.COST, write_html=False)
    del r["approval"]
    validate_report(r)
    assert approval_text(r.get("approval")) == NOT_REQUIRED


# -- the UI run page (tests/ui/app_harness.py: the real app, a fake auth manager and metadata DB) ---------


def _harness(monkeypatch: pytest.MonkeyPatch, layout) -> UiHarness:
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity

    return UiHarness(monkeypatch, [record(DAG, RUN, layout.run_dir)], {"alice": {(DAG, None), (DAG, DagAccessEntity.RUN)}})


def test_the_run_page_shows_who_approved_and_when(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    allow_only(monkeypatch, tmp_path / "out")
    layout = make_run(tmp_path / "out")
    _approved(layout.run_dir)
    ui = _harness(monkeypatch, layout)
    page = ui.get(run_path(DAG, RUN))
    assert page.status_code == 200
    assert ('<p class="note" id="approval">approval: approved by Alice &lt;b&gt;Smith&lt;/b&gt; (id 7) at '
            "2026-11-30T01:00:02+00:00</p>") in page.text
    figures = ui.get("/api" + run_path(DAG, RUN)).json()["figures"]
    assert figures["approval"]["responded_by"] == ALICE
    assert figures["approval"]["responded_at"] == "2026-11-30T01:00:02+00:00"


def test_the_run_page_of_a_run_without_approval_says_not_required(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    allow_only(monkeypatch, tmp_path / "out")
    layout = make_run(tmp_path / "out")
    ui = _harness(monkeypatch, layout)
    assert '<p class="note" id="approval">approval: not required</p>' in ui.get(run_path(DAG, RUN)).text
    figures = ui.get("/api" + run_path(DAG, RUN)).json()["figures"]
    assert figures["approval"] is None and figures["approval_text"] == NOT_REQUIRED
