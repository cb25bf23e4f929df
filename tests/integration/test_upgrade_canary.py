"""The upgrade canary in real Airflow runs (``dag.test()``) with the real MiniLM: a model with shuffled weights
is refused before the fan-out (no shard starts, the published table is unchanged); the same model re-run
through ``batch_inference_on_model_upgrade`` passes and the report records the figures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import numpy as np
import pytest
from batch_inference.params import default_model_path
from run_helpers import dag_run_dir
from test_canary_dag import REPO, SAMPLE, airflow_env, run_dag  # noqa: F401 - the module's Airflow home fixture

pytestmark = [pytest.mark.integration, pytest.mark.dagrun]

TABLE = "emb_upgrade"


def broken_model(dest: Path, seed: int = 0) -> Path:
    """A copy of the bundled MiniLM whose every weight tensor has its values shuffled (seeded): same
    architecture, tokenizer and files, meaningless weights."""
    from safetensors.numpy import load_file, save_file

    shutil.copytree(default_model_path(), dest)
    rng = np.random.default_rng(seed)
    tensors = load_file(str(dest / "model.safetensors"))
    shuffled = {k: rng.permutation(v.reshape(-1)).reshape(v.shape) for k, v in tensors.items()}
    save_file(shuffled, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def _conf(tmp_path: Path, **kw) -> dict:
    conf = {"input_uri": str(SAMPLE), "output_root": str(tmp_path / "out"),
            "duckdb_path": str(tmp_path / "out" / "warehouse.duckdb"), "runner": "local", "reuse": "off",
            "rows_per_shard": 60, "row_limit": 120, "shard_by": "rows", "output_table": TABLE,
            "canary_min_rows": 120, "model": default_model_path()}
    conf.update(kw)
    return conf


def _live(tmp_path: Path) -> tuple[str, list]:
    con = duckdb.connect(str(tmp_path / "out" / "warehouse.duckdb"), read_only=True)
    try:
        comment = con.execute("SELECT comment FROM duckdb_tables() WHERE schema_name = 'batch_inference' "
                              "AND table_name = ?", [TABLE]).fetchall()[0][0]
        rows = con.execute(f'SELECT id, embedding FROM "batch_inference"."{TABLE}" ORDER BY id LIMIT 3').fetchall()
    finally:
        con.close()
    return json.loads(comment)["run_id"], rows


def test_a_broken_model_is_refused_and_the_same_model_passes(tmp_path: Path, airflow_env: dict[str, str]) -> None:  # noqa: F811
    first, out = run_dag(_conf(tmp_path), airflow_env, "batch_inference_backfill")
    assert first["state"].endswith("success"), out[-6000:]
    first_dir = dag_run_dir(tmp_path / "out", first["run_id"])
    upgrade = json.loads((first_dir / "projection.json").read_text())["upgrade"]
    assert upgrade["decision"] == "passed" and "no previous publish" in upgrade["message"]
    published = _live(tmp_path)
    assert published[0] == first["run_id"]

    broken = broken_model(tmp_path / "broken-minilm")
    result, out = run_dag(_conf(tmp_path, model=str(broken)), airflow_env, "batch_inference_on_model_upgrade")
    assert result["state"].endswith("failed"), out[-4000:]
    tasks = result["tasks"]
    assert tasks["plan"].endswith("success") and tasks["canary"].endswith("failed"), tasks
    assert not any(k.startswith("infer_local") and v.endswith("success") for k, v in tasks.items()), tasks
    run_dir = dag_run_dir(tmp_path / "out", result["run_id"])
    projection = json.loads((run_dir / "projection.json").read_text())
    assert projection["decision"] == "refused_upgrade", projection.get("message")
    assert projection["message"].startswith("REFUSED (upgrade): ")
    section = projection["upgrade"]
    assert section["mode"] == "on" and section["rows_compared"] == 120
    assert section["embedding"]["neighbours"]["overlap"] < 0.3 and section["embedding"]["neighbours"]["k"] == 10
    assert "REFUSED (upgrade)" in out and "the canary refused the run" in out
    for shard in ("00000", "00001"):
        assert not (run_dir / "shards" / shard / "attempts").exists(), "no shard worker started"
        assert not (run_dir / "shards" / shard / "_SUCCESS.json").exists()
    assert _live(tmp_path) == published, "the published table is unchanged"

    again, out = run_dag(_conf(tmp_path), airflow_env, "batch_inference_on_model_upgrade")
    assert again["state"].endswith("success"), out[-6000:]
    again_dir = dag_run_dir(tmp_path / "out", again["run_id"])
    report = json.loads((again_dir / "report.json").read_text())
    assert "upgrade check passed: 120 canary rows" in (again_dir / "report.html").read_text()
    up = report["upgrade"]
    assert up["decision"] == "passed" and up["compared"] and up["previous"]["run_id"] == first["run_id"]
    # Same model: every vector agrees (cosine), but neighbour sets of near-tied rows (duplicate texts of the
    # sample, bf16 batches of another composition) may swap a member: a CI run measured 0.989.
    assert up["embedding"]["neighbours"]["overlap"] >= 0.97
    assert up["embedding"]["cosine"]["p5"] >= 0.999
    assert _live(tmp_path)[0] == again["run_id"]
