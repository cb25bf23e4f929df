"""Input attacks (issue #38): each test is one hostile input through the real path it takes, and passes only
when the attack is refused.

* **Links out of the allowed roots**: a directory input holding a symbolic link to a file outside the
  roots, and a glob matching a linked directory outside, are refused by the real planner
  (``PlanError`` naming ``input_uri``, never the roots nor the link's target); a file swapped for a link
  after planning is refused by the real worker process (exit code 2) before it reads a byte. The file
  outside holds a planted secret: it must reach no output, manifest or log.
* **Resource exhaustion**: a 32 MiB JSONL line is read in bounded memory and dead-lettered by the real
  worker (the other rows are processed); a Parquet row group over the policy's size is refused by the
  planner and, planned around the planner, by the worker.
* **Hostile prompt templates**: ``center``, ``format``, ``replace``, ``~``, ``%``, ``join`` (and friends)
  with huge widths dead-letter the row in the LLM engine's ``prepare`` instead of building gigabytes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batch_contract.engine_config import WorkerSettings
from batch_contract.enums import DeadLetterReason, ExitCode
from batch_contract.layout import RunLayout, chunk_of
from batch_contract.manifest import Segment
from batch_inference.planner import PlanError, PlanRequest, plan
from batch_worker.reader import iter_shard_blocks
from run_helpers import WORKER_ENV, write_run

pytestmark = pytest.mark.integration

ENGINE = {"kind": "encoder", "dtype": "float32"}
WORKER = {"chunk_rows": 64, "token_budget": 4096, "progress_interval_seconds": 60.0}


@pytest.fixture
def estate(tmp_path: Path, planted) -> dict[str, Path]:
    """``allowed/in`` (the user's input, two good rows), ``private/`` (outside the roots: a JSONL file and
    a directory holding the planted secret) and ``alias`` (a link to ``allowed``: the root as the policy
    spells it, so a message naming the root would show the word ``alias``)."""
    allowed, private = tmp_path / "allowed", tmp_path / "private"
    (allowed / "in").mkdir(parents=True)
    (private / "dir").mkdir(parents=True)
    _jsonl(allowed / "in" / "a.jsonl", [{"id": "a1", "text": "first row"}, {"id": "a2", "text": "second row"}])
    secret_row = [{"id": "stolen", "text": f"the secret is {planted.env}"}]
    _jsonl(private / "secret.jsonl", secret_row)
    _jsonl(private / "dir" / "more.jsonl", secret_row)
    (tmp_path / "alias").symlink_to(allowed)
    return {"tmp": tmp_path, "in": allowed / "in", "private": private, "root": tmp_path / "alias"}


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _request(estate: dict[str, Path], input_uri: str, run_id: str, **kw) -> PlanRequest:
    return PlanRequest(input_uri=input_uri, id_column="id", text_column="text",
                       output_root=str(estate["tmp"] / "out"), run_id=run_id, engine=ENGINE,
                       worker=kw.pop("worker", WORKER), input_roots=[str(estate["root"])], **kw)


def _refused_plan(estate: dict[str, Path], input_uri: str, run_id: str, no_secrets) -> str:
    with pytest.raises(PlanError, match=r"^input_uri: .*outside the allowed input locations") as info:
        plan(_request(estate, input_uri, run_id))
    message = str(info.value)
    assert "alias" not in message, f"the message names the allowed root: {message}"
    assert "private" not in message, f"the message names the link's target: {message}"
    assert not (estate["tmp"] / "out" / "runs" / run_id / "manifest.json").exists()
    no_secrets(message, estate["tmp"] / "out")
    return message


def _worker(run_dir: str, shard_id: str = "00000") -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "batch_worker", "run", "--run-dir", run_dir, "--shard", shard_id],
                          env={**os.environ, **WORKER_ENV}, capture_output=True, text=True, timeout=300)


def _outputs(run_dir: str) -> tuple[list[dict], list[dict]]:
    """(result rows, dead letters) of shard 00000."""
    sdir = Path(RunLayout.from_run_dir(run_dir).shard_dir("00000"))
    results, dead = [], []
    for path in sorted(sdir.glob("*.parquet")):
        if chunk_of(path.name) is None:
            continue
        (results if path.name.startswith("part-") else dead).extend(pq.read_table(path).to_pylist())
    return results, dead


# --------------------------------------------------------------------------------- links out of the roots


def test_directory_input_with_a_symlink_to_a_file_outside_the_roots(estate, no_secrets) -> None:
    (estate["in"] / "b.jsonl").symlink_to(estate["private"] / "secret.jsonl")
    message = _refused_plan(estate, str(estate["in"]), "dir_link", no_secrets)
    assert "b.jsonl" in message


def test_glob_matching_a_symlinked_directory_outside_the_roots(estate, no_secrets) -> None:
    (estate["in"] / "sub").mkdir()
    _jsonl(estate["in"] / "sub" / "ok.jsonl", [{"id": "s1", "text": "fine"}])
    (estate["in"] / "ext").symlink_to(estate["private"] / "dir")
    message = _refused_plan(estate, f"{estate['in']}/*/*.jsonl", "glob_link", no_secrets)
    assert "/ext" in message


def test_input_tree_linking_to_the_filesystem_root_is_refused_without_walking_it(estate, no_secrets) -> None:
    (estate["in"] / "everything").symlink_to("/")
    t0 = time.perf_counter()
    _refused_plan(estate, str(estate["in"]), "root_link", no_secrets)
    assert time.perf_counter() - t0 < 5.0, "the planner walked outside the roots"


def test_file_swapped_for_a_symlink_after_planning_is_refused_by_the_worker(estate, no_secrets) -> None:
    manifest, refs = plan(_request(estate, str(estate["in"]), "swap"))
    assert manifest.input.roots == [str(estate["root"])] and manifest.rows == 2
    victim = estate["in"] / "a.jsonl"
    victim.unlink()
    victim.symlink_to(estate["private"] / "secret.jsonl")
    proc = _worker(refs[0]["run_dir"])
    assert proc.returncode == int(ExitCode.BAD_INPUT), proc.stderr[-3000:]
    assert "a.jsonl: resolves outside the allowed input locations" in proc.stderr
    assert "refusing to read it" in proc.stderr
    assert "alias" not in proc.stderr and str(estate["private"]) not in proc.stderr
    assert _outputs(refs[0]["run_dir"]) == ([], [])
    no_secrets(proc.stdout, proc.stderr, estate["tmp"] / "out")


# ------------------------------------------------------------------------------------ resource exhaustion


def test_a_32_mib_jsonl_line_is_dead_lettered_in_bounded_memory(estate) -> None:
    big = b'{"id": "big", "text": "' + b"x" * (32 << 20) + b'"}'
    src = estate["in"] / "a.jsonl"
    src.write_bytes(big + b'\n{"id": "ok", "text": "a short ordinary row"}\n')
    t0 = time.perf_counter()
    manifest, refs = plan(_request(estate, str(src), "long_line"))
    assert manifest.rows == 2 and time.perf_counter() - t0 < 10.0
    tracemalloc.start()
    blocks = list(iter_shard_blocks(manifest.input, [Segment(0, 0, 2)], 10, settings=manifest.worker))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < manifest.worker.max_line_bytes + (8 << 20), f"held {peak} bytes: the line was read whole"
    assert blocks[0].ids == [None, "ok"] and blocks[0].record_errors[0] is not None
    proc = _worker(refs[0]["run_dir"])
    assert proc.returncode == int(ExitCode.OK), proc.stderr[-3000:]
    results, dead = _outputs(refs[0]["run_dir"])
    assert [r["id"] for r in results] == ["ok"]
    assert [(d["id"], d["reason"], d["source_row"]) for d in dead] == [(None, DeadLetterReason.INVALID_RECORD.value, 0)]
    assert dead[0]["detail"].startswith(f"line is {len(big)} bytes, above worker.max_line_bytes")


def test_a_parquet_row_group_over_the_policy_size_is_refused(estate) -> None:
    src = estate["in"] / "big.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "text": ["x" * (16 << 20), "y"]}), src, compression="zstd")
    policy = {**WORKER, "max_row_group_bytes": 4 << 20}
    with pytest.raises(PlanError, match=r"^input: .*big\.parquet row group 0 holds \d{8} bytes \(uncompressed\)"):
        plan(_request(estate, str(src), "big_rg", worker=policy))
    run_dir = write_run(estate["tmp"] / "out2", src, engine=ENGINE, worker=policy)  # a plan made around the planner
    proc = _worker(run_dir)
    assert proc.returncode == int(ExitCode.BAD_INPUT), proc.stderr[-3000:]
    assert "big.parquet: row group 0 holds" in proc.stderr and "max_row_group_bytes (4194304)" in proc.stderr
    assert _outputs(run_dir) == ([], [])


# ------------------------------------------------------------------------------- hostile prompt templates

HOSTILE_TEMPLATES = {
    "center": "{{ text|center(1000000000) }}",
    "format": "{{ '%*s'|format(1000000000, text) }}",
    "replace": "{{ text|replace('', text) }}",
    "concat": "{% set a = text ~ text %}{% set b = a ~ a %}{% set c = b ~ b %}{% set d = c ~ c %}"
              "{% set e = d ~ d %}{% set f = e ~ e %}{% set g = f ~ f %}{{ g ~ g ~ g ~ g }}",
    "percent": "{{ '%1000000000s' % text }}",
    "join": "{{ text|list|join(text) }}",
    "indent": "{{ text|indent(1000000000) }}",
    "wordwrap": "{{ text|wordwrap(1, wrapstring=text ~ text) }}",
    "batch": "{{ text|batch(1000000000, text)|list }}",
    "block": "{% filter upper %}{% for c in text %}{{ text }}{% endfor %}{% endfilter %}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_TEMPLATES))
def test_hostile_prompt_template_dead_letters_the_row(name: str) -> None:
    from batch_contract.llm_config import LLMConfig
    from batch_worker.engines.base import ChunkRows
    from batch_worker.engines.llm import LLMEngine
    from batch_worker.prompting import PromptRenderer

    config = LLMConfig(model_path="/m", max_tokens=16, user_template=HOSTILE_TEMPLATES[name])
    engine = LLMEngine(config, WorkerSettings())
    engine.renderer = PromptRenderer(config)  # the engine's renderer, without a model or tokenizer
    text = "word, " * 20_000  # 120,000 characters: under the 131,072-character row limit
    rows = ChunkRows(ids=["r1"], texts=[text], text_repaired=[False], source_uri=["in.jsonl"], source_row=[0],
                     fields=pa.table({"id": ["r1"], "text": [text]}))
    tracemalloc.start()
    t0 = time.perf_counter()
    prepared = engine.prepare(rows)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert prepared.ids == [] and [r.id for r in prepared.rejects] == ["r1"]
    assert prepared.rejects[0].reason in {DeadLetterReason.TEMPLATE_ERROR, DeadLetterReason.TOO_LONG}
    assert "SecurityError" in prepared.rejects[0].detail or "max_prompt_chars" in prepared.rejects[0].detail
    assert peak < 64 << 20, f"traced peak {peak} bytes"
    assert seconds < 10.0
