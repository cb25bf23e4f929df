"""Cost report: a synthetic run with known seconds, counts and prices gives hand-computed figures.

The synthetic run (2 shards, L4 x 2 per shard, spot $1.80/GPU-h, publish machine $0.36/h):

| shard | rows in | ok | dead | stage seconds (total) | inference s | tokens real / padded | n_tokens |
|---|---|---|---|---|---|---|---|
| 00000 | 6 | 5 | 1 | 10+2+3+60+4+1 = 80 | 60 | 100 / 120 | 10,20,20,30,20 |
| 00001 | 4 | 4 | 0 | 10+1+2+30+2+5 = 50 | 30 |  60 /  64 | 15,15,15,15 |

publish: 9 rows published, 1 dead letter, 20 s.
"""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract.engine_config import ConfigError, EncoderConfig, WorkerSettings
from batch_contract.layout import RunLayout
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec
from batch_contract.marker import AttemptRecord, ShardMarker, ShardProgress
from batch_contract.schemas import part_schema
from batch_inference.pricing import DEFAULT_PRICES, cost_params_from_dict
from batch_inference.report import asset_extra, build_report, markdown_summary, text_summary, validate_report

DAG_ID = "batch_embed"
COST = {"accelerator": "nvidia-l4", "gpu_count": 2, "pricing": "spot", "spot_usd_per_gpu_hour": 1.8,
        "on_demand_usd_per_gpu_hour": 3.6, "publish_usd_per_hour": 0.36}
PUBLISH = {"table": "emb", "backend": "duckdb", "fingerprint": "fp", "rows_input": 10, "rows_published": 9,
           "rows_dead_letter": 1, "rows_missing": 0, "duplicates_removed": 0, "publish_seconds": 20.0,
           "noop": False, "success_ratio": 1.0, "min_success_ratio": 1.0}
STAGES_0 = {"model_load": 10.0, "input_read": 2.0, "tokenize": 3.0, "inference": 60.0, "write": 4.0, "idle": 1.0}
STAGES_1 = {"model_load": 10.0, "input_read": 1.0, "tokenize": 2.0, "inference": 30.0, "write": 2.0, "idle": 5.0}
LENGTHS = {"00000": [10, 20, 20, 30, 20], "00001": [15, 15, 15, 15]}


def _manifest(run_id: str) -> Manifest:
    spec = InputSpec(uri="data/in.parquet", format="parquet", id_column="id", text_column="text",
                     files=[InputFile(uri="data/in.parquet", rows=10)])
    shards = [ShardSpec("00000", [Segment(0, 0, 6)]), ShardSpec("00001", [Segment(0, 6, 10)])]
    return Manifest(run_id=run_id, input=spec, shards=shards, engine=EncoderConfig().to_dict(),
                    worker=WorkerSettings(token_budget=64, max_batch_rows=4),
                    created_at="2026-11-30T01:00:00+00:00")


def _write_part(layout: RunLayout, shard_id: str, lengths: list[int]) -> str:
    name = f"part-00000-{shard_id}.parquet"
    n = len(lengths)
    table = pa.table(
        {"id": [f"{shard_id}-{i}" for i in range(n)], "fingerprint": ["fp"] * n,
         "n_tokens": pa.array(lengths, pa.int32()), "truncated": [False] * n, "text_repaired": [False] * n,
         "embedding": pa.array([[0.0, 1.0]] * n, pa.list_(pa.float32(), 2))},
        schema=part_schema("embedding", 2),
    )
    path = Path(layout.shard_dir(shard_id)) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return name


def _marker(run_id: str, shard_id: str, **kw) -> ShardMarker:
    return ShardMarker(run_id=run_id, shard_id=shard_id, fingerprint="fp", **kw)


def make_run(root: Path, run_id: str = "synthetic_run", *, preempted: bool = False,
             complete: bool = True) -> RunLayout:
    """Write the synthetic run of the module docstring under ``root`` and return its layout."""
    layout = RunLayout(str(root), run_id)
    Path(layout.run_dir).mkdir(parents=True)
    Path(layout.manifest_uri).write_bytes(_manifest(run_id).to_json_bytes())
    part0 = _write_part(layout, "00000", LENGTHS["00000"])
    m0 = _marker(run_id, "00000", rows_input=6, rows_ok=5, rows_dead_letter=1, rows_truncated=1,
                 dead_letter_reasons={"empty_text": 1}, tokens_real=100, tokens_padded=120,
                 stage_seconds=STAGES_0, steady_rows_per_s=4.0, cpu_seconds=70.0,
                 gpu={"util_mean": 80.0, "mem_max_bytes": 2_000_000_000}, parts=[part0],
                 engine={"device": "cuda", "dtype": "bfloat16"},
                 started_at="2026-11-30T01:00:10+00:00", finished_at="2026-11-30T01:01:30+00:00",
                 attempts=[{"attempt_id": "a0", "shard_id": "00000", "started_at": "2026-11-30T01:00:10+00:00",
                            "status": "complete", "exit_code": 0, "rows_committed": 6, "rows_processed": 6}])
    Path(layout.marker_uri("00000")).write_bytes(m0.to_json_bytes())
    part1 = _write_part(layout, "00001", LENGTHS["00001"])
    attempts1 = [AttemptRecord("b1", "00001", "2026-11-30T01:00:20+00:00", status="complete", exit_code=0,
                               rows_committed=2, rows_processed=2, rows_skipped_resume=2)]
    if preempted:
        attempts1.insert(0, AttemptRecord("b0", "00001", "2026-11-30T01:00:05+00:00", status="interrupted",
                                          exit_code=75, rows_committed=2, rows_processed=3,
                                          stage_seconds={"model_load": 10.0, "inference": 5.0}))
    if complete:
        m1 = _marker(run_id, "00001", rows_input=4, rows_ok=4, rows_dead_letter=0, tokens_real=60,
                     tokens_padded=64, stage_seconds=STAGES_1, steady_rows_per_s=2.0, cpu_seconds=40.0,
                     gpu={"util_mean": 50.0, "mem_max_bytes": 3_000_000_000}, parts=[part1],
                     started_at="2026-11-30T01:00:05+00:00", finished_at="2026-11-30T01:01:00+00:00",
                     attempts=[json.loads(a.to_json_bytes()) for a in attempts1])
        Path(layout.marker_uri("00001")).write_bytes(m1.to_json_bytes())
    else:
        prog = ShardProgress("00001", "running", 4, 2, 0, 1.5, 1.3, "2026-11-30T01:00:40+00:00")
        Path(layout.progress_uri("00001")).write_bytes(prog.to_json_bytes())
    if preempted:  # a worker killed hard on shard 0: its record still says running, no exit code
        killed = AttemptRecord("a-killed", "00000", "2026-11-30T01:00:00+00:00", rows_processed=4)
        adir = Path(layout.attempts_dir("00000"))
        adir.mkdir(parents=True)
        (adir / "a-killed.json").write_bytes(killed.to_json_bytes())
    return layout


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("out")
    layout = make_run(root)
    report = build_report(layout.run_dir, dag_id=DAG_ID, publish_summary=PUBLISH, cost_params=COST)
    return layout, report


def test_headline_figures_equal_hand_computed(built):
    _, r = built
    # worker: 130 s x 2 GPUs x $1.80/h = $0.13; publish: 20 s x $0.36/h = $0.002
    assert r["cost_usd"] == pytest.approx(0.132)
    assert r["cost_per_million_rows_usd"] == pytest.approx(0.132 / 9 * 1e6)
    assert r["cost_per_million_tokens_usd"] == pytest.approx(0.132 / 160 * 1e6)  # 160 real input tokens
    assert r["padding_efficiency"] == pytest.approx(160 / 184)
    assert (r["rows_input"], r["rows_published"], r["rows_dead_letter"]) == (10, 9, 1)
    assert r["rows_truncated"] == 1 and r["dead_letter_reasons"] == {"empty_text": 1}
    assert r["worker_seconds"] == pytest.approx(130.0) and r["gpu_seconds"] == pytest.approx(260.0)


def test_stage_seconds_fractions_and_cost_split(built):
    _, r = built
    assert r["stage_seconds"] == pytest.approx({"model_load": 20, "input_read": 3, "tokenize": 5,
                                                "inference": 90, "write": 6, "idle": 6, "reuse": 0,
                                                "publish": 20})
    assert r["stage_fractions"]["inference"] == pytest.approx(90 / 150)
    assert r["stage_fractions"]["model_load"] == pytest.approx(20 / 150)
    assert r["stage_fractions"]["publish"] == pytest.approx(20 / 150)
    assert r["cost"]["by_stage_usd"]["inference"] == pytest.approx(90 * 2 * 1.8 / 3600)
    assert r["cost"]["by_stage_usd"]["publish"] == pytest.approx(0.002)
    assert sum(r["cost"]["by_stage_usd"].values()) == pytest.approx(r["cost_usd"])


def test_utilisation_throughput_and_counterfactuals(built):
    _, r = built
    assert r["utilisation"]["device"] == "gpu"
    assert r["utilisation"]["gpu_util_mean"] == pytest.approx((80 * 60 + 50 * 30) / 90)  # inference-weighted
    assert r["utilisation"]["gpu_mem_max_bytes"] == 3_000_000_000
    assert r["throughput"]["steady_rows_per_s_per_gpu"] == pytest.approx((4.0 + 2.0) / 2 / 2)
    assert r["throughput"]["inference_rows_per_s_per_gpu"] == pytest.approx(9 / 90 / 2)
    assert r["counterfactuals"]["on_demand"]["cost_usd"] == pytest.approx(130 * 2 * 3.6 / 3600 + 0.002)
    assert r["counterfactuals"]["spot"]["delta_vs_actual_usd"] == pytest.approx(0.0)


def test_random_order_padding_estimate(built):
    _, r = built
    est = r["counterfactuals"]["padding"]
    # shard 0: lengths rounded to 8 -> 16,24,24,32,24; batch = min(4, 64 // 32) = 2 rows;
    # E[max of 2] = 16*.2^2 + 24*(.8^2-.2^2) + 32*(1-.8^2) = 26.56 -> 5 x 26.56 = 132.8 padded tokens.
    # shard 1: all 15 -> 16; batch 4; 4 x 16 = 64 (same as measured: sorting cannot help).
    assert est["tokens_padded"] == pytest.approx(132.8 + 64)
    assert est["efficiency"] == pytest.approx(160 / 196.8)
    assert (est["batch_rows_min"], est["batch_rows_max"]) == (2, 4)
    assert est["cost_avoided_usd"] == pytest.approx(60 * 2 * 1.8 / 3600 * (132.8 / 120 - 1))
    assert r["token_lengths"]["stats"] == {"rows": 9, "mean": pytest.approx(160 / 9), "p50": 15, "p95": 30,
                                           "max": 30}
    assert sum(r["token_lengths"]["histogram"]["rows"]) == 9


def test_report_json_written_and_valid(built):
    layout, r = built
    on_disk = json.loads(Path(layout.report_json_uri).read_text())
    assert on_disk == r
    validate_report(r)
    assert r["schema_version"] == 1 and r["complete"] and r["shards_missing"] == []


def test_html_renders_with_all_charts(built):
    layout, r = built

    class Collector(HTMLParser):
        def __init__(self):
            super().__init__()
            self.charts: dict[str, str] = {}
            self.tables: list[str] = []
            self.title = ""
            self._in_title = False

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "img" and "data-chart" in a:
                self.charts[a["data-chart"]] = a["src"]
            if tag == "table":
                self.tables.append(a.get("id", ""))
            self._in_title = tag == "title"

        def handle_data(self, data):
            if self._in_title:
                self.title += data

    page = Path(layout.report_html_uri).read_text()
    p = Collector()
    p.feed(page)
    assert "synthetic_run" in p.title
    assert set(p.charts) == {"time_by_stage", "shard_throughput", "token_histogram", "cost_history"}
    for src in p.charts.values():
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"stages", "cost", "rows", "tokens", "attempts", "shards"} <= set(p.tables)
    assert "<script" not in page and "http://" not in page.replace("http://www.w3.org", "")


def test_preempted_and_killed_attempts_show_redone_rows(tmp_path):
    layout = make_run(tmp_path, "preempted_run", preempted=True)
    r = build_report(layout.run_dir, dag_id=DAG_ID, publish_summary=PUBLISH, cost_params=COST)
    validate_report(r)
    att = r["attempts"]
    assert att["preemptions"] == 1 and att["killed"] == 1
    assert att["rows_redone"] == (3 - 2) + (4 - 0)
    assert att["by_outcome"] == {"ok": 2, "preempted": 1, "killed": 1, "failed": 0, "running": 0}
    assert att["shards_retried"] == 2
    assert att["interrupted_seconds"] == pytest.approx(15.0)  # the preempted attempt's own stage seconds
    assert att["interrupted_cost_usd"] == pytest.approx(15.0 * 2 * 1.8 / 3600)
    by_shard = {s["shard_id"]: s for s in r["shards"]}
    assert (by_shard["00001"]["preemptions"], by_shard["00001"]["rows_redone"]) == (1, 1)
    assert (by_shard["00000"]["killed"], by_shard["00000"]["rows_redone"]) == (1, 4)
    md = markdown_summary(r)
    assert "1 / 5" in md.replace(",", "")  # preemptions / rows re-done
    text = text_summary(r)
    assert "|" not in text and "1 / 5" in text.replace(",", "") and "steady rows/s per GPU" in text
    cpu = {**r, "cost": {**r["cost"], "params": {**r["cost"]["params"], "accelerator": "cpu"}}}
    assert "per GPU" not in text_summary(cpu) and "steady rows/s per CPU worker" in text_summary(cpu)
    assert "result cache" not in text and r.get("rows_reused", 0) == 0
    reused = {**r, "rows_reused": 6000, "rows_computed": 0, "reuse": {"cost_avoided_usd": 0.25}}
    line = next(ln for ln in text_summary(reused).splitlines() if "result cache" in ln)
    assert "6,000 / 0" in line and "$0.25" in line, "a rerun says on the terminal what it reused"
    assert "preempted" in Path(layout.report_html_uri).read_text()


def test_incomplete_run_names_missing_shards(tmp_path):
    layout = make_run(tmp_path, "partial_run", complete=False)
    r = build_report(layout.run_dir, dag_id=DAG_ID, publish_summary=None, cost_params=COST, write_html=False)
    validate_report(r)
    assert not r["complete"] and r["shards_missing"] == ["00001"]
    assert r["shards"][1]["status"] == "running" and r["shards"][1]["seconds"] is None
    assert r["rows_published"] == 5 and r["rows_missing"] == 10 - 5 - 1
    assert r["stage_seconds"]["publish"] == 0.0
    assert not Path(layout.report_html_uri).exists()
    assert "00001" in markdown_summary(r)


def test_history_reads_same_dag_runs_only(tmp_path):
    older = make_run(tmp_path, "run_a")
    build_report(older.run_dir, dag_id=DAG_ID, publish_summary=PUBLISH, cost_params=COST, write_html=False)
    other = make_run(tmp_path, "run_b")
    build_report(other.run_dir, dag_id="another_dag", publish_summary=PUBLISH, cost_params=COST,
                 write_html=False)
    current = make_run(tmp_path, "run_c")
    r = build_report(current.run_dir, dag_id=DAG_ID, publish_summary=PUBLISH, cost_params=COST)
    assert [h["run_id"] for h in r["history"]] == ["run_a"]
    assert r["history"][0]["cost_per_million_rows_usd"] == pytest.approx(0.132 / 9 * 1e6)


def test_asset_extra_is_small_and_json_safe(built):
    _, r = built
    extra = asset_extra(r)
    assert json.loads(json.dumps(extra)) == extra
    assert len(json.dumps(extra)) < 1024
    assert extra["cost_per_million_rows_usd"] == pytest.approx(0.132 / 9 * 1e6, rel=1e-6)
    assert extra["report_uri"].endswith("report.json") and extra["preemptions"] == 0


def test_cost_params_defaults_aliases_and_errors():
    p = cost_params_from_dict({"accelerator": "nvidia-h100-80gb", "pricing": "on_demand"})
    assert p.usd_per_gpu_hour == DEFAULT_PRICES["nvidia-h100-80gb"].on_demand_usd_per_hour
    assert p.price_taken_on and "http" in p.price_source
    alias = cost_params_from_dict({"gpu_hour_usd_spot": 0.7, "gpu_hour_usd_on_demand": 2.3})
    assert (alias.spot_usd_per_gpu_hour, alias.on_demand_usd_per_gpu_hour, alias.price_source) == (0.7, 2.3, "user")
    for bad, word in [({"pricing": "reserved"}, "pricing"), ({"gpu_count": 0}, "gpu_count"),
                      ({"accelerator": "tpu-v9"}, "accelerator"), ({"colour": 1}, "colour"),
                      ({"spot_usd_per_gpu_hour": -1}, "spot_usd_per_gpu_hour")]:
        with pytest.raises(ConfigError, match=word):
            cost_params_from_dict(bad)
    for name, price in DEFAULT_PRICES.items():
        assert price.spot_usd_per_hour <= price.on_demand_usd_per_hour, name
        assert price.source and price.taken_on, name


def test_missing_manifest_is_a_clear_error(tmp_path):
    run_dir = tmp_path / "runs" / "nothing_here"
    run_dir.mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="manifest"):
        build_report(str(run_dir), dag_id=DAG_ID, publish_summary=None, cost_params=COST)


def test_schema_rejects_a_broken_report(built):
    import jsonschema

    _, r = built
    broken = {k: v for k, v in r.items() if k != "cost_per_million_rows_usd"}
    with pytest.raises(jsonschema.ValidationError, match="cost_per_million_rows_usd"):
        validate_report(broken)
    with pytest.raises(jsonschema.ValidationError):
        validate_report({**r, "stage_seconds": {**r["stage_seconds"], "inference": -1.0}})


def test_usd_formatting_never_scientific():
    from batch_inference.report import fmt

    assert [fmt.usd(v) for v in (1234.567, 0.12345, 6.7e-07, 0.0, None)] == [
        "$1,234.57", "$0.1235", "$0.00000067", "$0", "n/a"]
    assert fmt.seconds(3725) == "1h02m" and fmt.pct(0.9731) == "97.3%"


def test_html_tables_are_capped_with_a_note(built, monkeypatch):
    from batch_inference.report import page

    _, r = built
    monkeypatch.setattr(page, "MAX_TABLE_ROWS", 1)
    html = page.render_html(r)
    assert "Showing 1 of 2 rows" in html  # 2 shards, 2 attempts
    shards_table = html.split('<table id="shards">', 1)[1].split("</table>", 1)[0]
    assert shards_table.count("<tr>") == 2  # header + the first shard only
    assert "00000" in shards_table and "00001" not in shards_table


def test_cross_shard_duplicate_ids_from_publish_count_as_duplicate_id_dead_letters(tmp_path):
    layout = make_run(tmp_path)
    publish = {**PUBLISH, "rows_published": 8, "rows_dead_letter": 2, "duplicate_ids_across_shards": 1}
    r = build_report(layout.run_dir, dag_id=DAG_ID, publish_summary=publish, cost_params=COST, write_html=False)
    assert r["dead_letter_reasons"] == {"duplicate_id": 1, "empty_text": 1}
    assert sum(r["dead_letter_reasons"].values()) == r["rows_dead_letter"] == 2


def _set_hosts(layout: RunLayout, facts: dict[str, dict]) -> None:
    for shard_id, host in facts.items():
        path = Path(layout.marker_uri(shard_id))
        marker = ShardMarker.from_json_bytes(path.read_bytes())
        marker.host_facts = host
        path.write_bytes(marker.to_json_bytes())


AMD = {"cpu_model": "AMD EPYC", "logical_cores": 2, "threads_per_core": 1, "bf16": True, "amx": False,
       "caches": [{"level": 2, "type": "Unified", "size_bytes": 1 << 20, "shared_by": 1}], "load_avg": [1.0, 1, 1]}
XEON = {**AMD, "cpu_model": "Intel Xeon", "amx": True,
        "caches": [{"level": 2, "type": "Unified", "size_bytes": 2 << 20, "shared_by": 1}]}


def test_shards_on_different_hosts_are_named_per_shard(tmp_path):
    layout = make_run(tmp_path, "two_hosts")
    _set_hosts(layout, {"00000": AMD, "00001": XEON})
    r = build_report(layout.run_dir, dag_id=DAG_ID, publish_summary=None, cost_params=COST)
    validate_report(r)
    assert [(g["host"], g["shards"]) for g in r["hosts"]] == [
        ("AMD EPYC, 2 cores x 1 thread, L2 1 MiB, bf16", ["00000"]),
        ("Intel Xeon, 2 cores x 1 thread, L2 2 MiB, AMX", ["00001"])]
    assert [s["host"] for s in r["shards"]] == [g["host"] for g in r["hosts"]]
    html = Path(layout.report_html_uri).read_text()
    assert "2 kinds of host" in html and "<th>host</th>" in html and "L2 2 MiB, AMX" in html


def test_shards_on_one_host_name_it_once(tmp_path):
    layout = make_run(tmp_path, "one_host")
    _set_hosts(layout, {"00000": AMD, "00001": {**AMD, "load_avg": [7.0, 5.0, 3.0]}})  # load differs only
    r = build_report(layout.run_dir, dag_id=DAG_ID, publish_summary=None, cost_params=COST)
    validate_report(r)
    assert len(r["hosts"]) == 1 and r["hosts"][0]["shards"] == ["00000", "00001"]
    assert all(s["host"] is None for s in r["shards"])
    html = Path(layout.report_html_uri).read_text()
    assert "Host: AMD EPYC" in html and "<th>host</th>" not in html


def test_the_canary_is_a_priced_stage(tmp_path):
    """The canary's rows are committed into the shards, whose markers count only their own work: its
    stage seconds (idle excluded) are the stage ``canary`` in worker seconds and every cost figure."""
    from batch_contract.canary import CanaryResult
    from batch_contract.storage import write_create_only

    layout = make_run(tmp_path)
    canary = CanaryResult(
        run_id=layout.run_id, fingerprint="f", engine_kind="encoder", model_digest="d" * 64, device="cpu",
        device_name="cpu", threads=2, sample_rows=4, sample_text_bytes=400, sample_tokens_real=40,
        sample_tokens_padded=44, model_load_seconds=6.0, steady_rows_per_s=10.0, steady_tokens_per_s=100.0,
        worker_seconds_per_token=0.01, padding_efficiency=0.9, strategy="fixed",
        chosen={"token_budget": 256, "max_batch_rows": 256},
        stage_seconds={"model_load": 6.0, "inference": 3.0, "write": 1.0, "idle": 50.0})
    write_create_only(layout.canary_uri, canary.to_json_bytes())
    r = build_report(layout.run_dir, dag_id=DAG_ID, publish_summary=PUBLISH, cost_params=COST)
    assert r["stage_seconds"]["canary"] == pytest.approx(10.0)           # idle left out
    assert r["worker_seconds"] == pytest.approx(140.0) and r["gpu_seconds"] == pytest.approx(280.0)
    # (130 + 10) s x 2 GPUs x $1.80/h + publish 20 s x $0.36/h
    assert r["cost_usd"] == pytest.approx(0.14 + 0.002)
    assert r["cost"]["by_stage_usd"]["canary"] == pytest.approx(0.01)
    validate_report(r)
