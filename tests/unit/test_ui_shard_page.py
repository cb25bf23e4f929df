"""The run page pages its shard table (issue #35): at most ``SHARD_PAGE_ROWS`` shard rows per page under
the counts of every state, a state filter, previous/next links; the JSON API keeps every shard."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from batch_contract import storage
from batch_contract.layout import RunLayout
from batch_contract.manifest import Manifest
from batch_inference.ui.figures import ShardRow
from batch_inference.ui.views import SHARD_PAGE_ROWS, shard_page
from synthetic_runs import RunSpec, build_run, write_input
from ui.app_harness import DAG, RUN, UiHarness, allow_only, record, run_path


def _row(i: int, state: str) -> ShardRow:
    return ShardRow(f"{i:05d}", state, 10, 10, 0, 1, 0, None, 1.0)


def test_shard_page_counts_every_state_and_clamps_the_page() -> None:
    rows = [_row(i, "complete" if i % 3 else "pending") for i in range(250)]
    first = shard_page(rows, 1, size=100)
    assert [r.shard_id for r in first.rows] == [f"{i:05d}" for i in range(100)]
    assert (first.page, first.pages, first.matching) == (1, 3, 250)
    assert first.by_state == {"pending": 84, "complete": 166}
    last = shard_page(rows, 99, size=100)
    assert (last.page, len(last.rows)) == (3, 50)
    pending = shard_page(rows, 1, "pending", size=100)
    assert pending.pages == 1 and all(r.state == "pending" for r in pending.rows) and len(pending.rows) == 84
    assert shard_page([], 5).rows == [] and shard_page([], 5).pages == 1


@pytest.fixture
def big_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> UiHarness:
    shards = SHARD_PAGE_ROWS + 30
    src = write_input(tmp_path / "in.parquet", [str(i) for i in range(shards)])
    built = build_run(tmp_path / "staging", RUN, src, RunSpec(shards=shards, chunk_rows=10,
                                                              skip_markers={"00003", "00120"}))
    layout = RunLayout(str(tmp_path / "out"), RUN, DAG)
    Path(layout.run_dir).parent.mkdir(parents=True)
    Path(built.run_dir).rename(layout.run_dir)
    manifest = Manifest.from_json_bytes(storage.read_bytes(layout.manifest_uri))
    storage.write_replace(layout.manifest_uri, dataclasses.replace(
        manifest, params={**manifest.params, "dag_id": DAG}).to_json_bytes())
    allow_only(monkeypatch, tmp_path / "out")
    return UiHarness(monkeypatch, [record(DAG, RUN, layout.run_dir)],
                     {"alice": {(DAG, None), (DAG, DagAccessEntity.RUN)}})


def test_run_page_shows_one_page_of_shards_with_links(big_run: UiHarness) -> None:
    page = big_run.get(run_path(DAG, RUN))
    assert page.status_code == 200, page.text
    assert page.text.count("data-shard=") == SHARD_PAGE_ROWS
    assert "page 1 of 2" in page.text and 'id="shards-next"' in page.text and 'id="shards-prev"' not in page.text
    assert "complete 128" in page.text and "pending 2" in page.text
    second = big_run.get(run_path(DAG, RUN) + "?shards_page=2")
    assert second.text.count("data-shard=") == 30 and 'data-shard="00120"' in second.text
    pending = big_run.get(run_path(DAG, RUN) + "?shard_state=pending")
    assert pending.text.count("data-shard=") == 2
    assert 'data-shard="00003"' in pending.text and 'data-shard="00120"' in pending.text
    assert big_run.get(run_path(DAG, RUN) + "?shard_state=<script>").status_code == 422
    assert big_run.get(run_path(DAG, RUN) + "?shards_page=0").status_code == 422
    assert len(big_run.get(f"/api/runs/{DAG}/{RUN.replace('+', '%2B')}").json()["shards"]) == SHARD_PAGE_ROWS + 30
