"""Benchmark: one run at the seed's scale (40M rows, 1,024 shards) planned, worked, gated, published,
reported and shown, each stage measured on its own (issue #35; docs/scale.md).

Stages, each in a child process of its own so that its peak RSS is its alone:

* ``generate``: ``--rows`` rows over a few hundred Parquet files (``id`` strings, ``text`` of a
  log-normal length spread: median 60 characters, a tail to 2,000), a few empty texts (dead letters).
  Not timed against a target.
* ``plan``: :func:`batch_inference.planner.plan` into 1,024 shards (``max_map_length`` 1,024): wall, CPU,
  peak RSS, the manifest's bytes and the XCom the DAG's mapped shard tasks receive (the shard refs: all
  of them, and the largest one).
* ``fanout``: Airflow's own scheduler (PostgreSQL, LocalExecutor, the four services) expands the plan's
  shard refs into mapped task instances of the product's fan-out shape, held in a pool of zero slots
  (``bench/scale_fanout.py``): seconds from the upstream task's end to the last mapped instance
  scheduled, and the bytes each receives.
* ``work``: every shard through the real worker runtime (:func:`batch_worker.runtime.run_shard`: reader,
  validation, writer, ledger, attempt records, progress, marker) with :class:`BenchEngine`, the real
  encoder engine (so its model digest and fingerprint are the real ones) whose model is never loaded:
  it answers each row with a label and a score. Two processes, as on the 2-core host.
* ``gate``: one poll as the deferred gate makes it (``check_completion`` + ``gate_progress`` on a store
  kept across polls): the first (cold: every marker read once) and the next (warm), with the storage
  requests of each (local: calls into the storage backend; ``gs://``: HTTP requests to the emulator,
  lists counted apart).
* ``publish``: :func:`batch_inference.publish.publish_run` into DuckDB with the coverage check
  (every input id exactly once in results or dead letters).
* ``report``: :func:`batch_inference.report.build.build_report` (report.json + report.html).
* ``ui``: the run page through the real FastAPI app (``tests/ui/app_harness.py``: fake users and DB,
  real views and storage reads), cold (first request) and warm.
* ``worker_exit``: ``python -m batch_worker run`` on a complete shard in a fresh interpreter: wall
  seconds to exit 0 and whether torch was imported.

Usage: ``make bench-scale`` (``SCALE_ROWS=`` rows, default 40,000,000; ``SCALE_ROOT=gs://...`` runs on
the GCS emulator it starts itself). Data under ``build/bench-scale/`` (deleted at the end unless
``--keep``). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
for sub in ("plugins", "worker_image", "tests", "bench"):
    if str(REPO / sub) not in sys.path:
        sys.path.insert(0, str(REPO / sub))

SHARDS = 1024
STAGES = ("generate", "plan", "fanout", "work", "gate", "publish", "report", "ui", "worker_exit")
DAG_ID = "batch_inference_backfill"
RUN_ID = "scale__bench"
ENGINE = {"kind": "encoder", "task": "classification"}
WORKER = {"reuse": "off"}
"""The result cache is off: its lookup scans every cache file of the fingerprint, one per completed part,
so a run of 1,024 shards would read O(shards^2) cache files (docs/scale.md, left for its own issue)."""
TARGETS = {"plan_wall_s": 60.0, "plan_peak_rss_mb": 1536.0, "gate_poll_wall_s": 2.0,
           "publish_rows_per_s": 300_000.0, "publish_peak_rss_mb": 3072.0, "report_wall_s": 20.0,
           "ui_run_page_s": 1.0, "gcs_gate_poll_list_requests": 10, "worker_exit_s": 1.0}


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB: ``VmHWM`` of ``/proc/self/status`` (of this
    program's memory alone: ``ru_maxrss`` keeps the parent's peak across ``exec``), else ``ru_maxrss``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_s() -> float:
    """User + system CPU seconds of this process (all threads)."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


# ----------------------------------------------------------------------------------------------- stages


def stage_generate(root: str, rows: int) -> dict[str, Any]:
    """Write ``rows`` input rows over ``ceil(rows / 150,000)`` files (at least 4, at most 300)."""
    import io

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from batch_contract import storage

    files = max(4, min(300, math.ceil(rows / 150_000)))
    rng = np.random.default_rng(35)
    words = [bytes(rng.integers(97, 123, size=int(n), dtype=np.uint8)) for n in rng.integers(2, 11, size=4096)]
    corpus = b" ".join(words)
    corpus = np.frombuffer(corpus * (1 + (1 << 20) // len(corpus)), dtype=np.uint8)
    bounds = np.linspace(0, rows, files + 1).astype(np.int64)
    total_bytes = 0
    for f in range(files):
        lo, hi = int(bounds[f]), int(bounds[f + 1])
        n = hi - lo
        lengths = np.clip(rng.lognormal(math.log(60), 0.8, size=n), 1, 2000).astype(np.int64)
        lengths[(np.arange(lo, hi) % 100_003) == 7] = 0  # empty text: an empty_text dead letter
        starts = rng.integers(0, len(corpus) - 2001, size=n)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        idx = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        text = pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(corpus[idx].tobytes()))
        ids = pc.binary_join_element_wise("doc-", pc.utf8_lpad(pc.cast(pa.array(np.arange(lo, hi)), pa.string()),
                                                               10, "0"), "")
        table = pa.table({"id": ids, "text": text.cast(pa.string())})
        sink = io.BytesIO()
        pq.write_table(table, sink, row_group_size=50_000, compression="zstd")
        total_bytes += sink.tell()
        storage.write_create_only(f"{root}/input/part-{f:04d}.parquet", sink.getvalue())
    return {"input_files": files, "input_bytes": total_bytes}


def stage_plan(root: str, rows: int) -> dict[str, Any]:
    """Plan the input into :data:`SHARDS` shards; manifest and XCom sizes."""
    from batch_contract import storage
    from batch_inference.planner import PlanRequest, plan

    request = PlanRequest(input_uri=f"{root}/input", id_column="id", text_column="text", output_root=f"{root}/out",
                          run_id=RUN_ID, dag_id=DAG_ID, engine=ENGINE, worker=WORKER, shard_by="rows",
                          rows_per_shard=math.ceil(rows / SHARDS),
                          max_map_length=SHARDS, params={"dag_id": DAG_ID})
    manifest, refs = plan(request)
    run_dir = refs[0]["run_dir"]
    return {"shards": len(manifest.shards), "rows": manifest.rows, "run_dir": run_dir,
            "manifest_bytes": len(storage.read_bytes(f"{run_dir}/manifest.json")),
            "xcom_refs_bytes": len(json.dumps(refs)),
            "xcom_bytes_per_shard_task_max": max(len(json.dumps(r)) for r in refs)}


def _work_one(args: tuple[str, list[str]]) -> int:
    """Run ``shard_ids`` of ``run_dir`` through the worker runtime with :class:`BenchEngine`."""
    import logging

    from batch_worker import runtime
    from scale_engine import BenchEngine

    logging.getLogger("batch_worker").setLevel(logging.WARNING)
    runtime.engine_class = lambda kind: BenchEngine
    run_dir, shard_ids = args
    bad = 0
    for sid in shard_ids:
        bad += runtime.run_shard(run_dir, sid, install_signals=False) != 0
    return bad


def _segment_tables(spec: Any, segments: list[Any]) -> Any:
    """``(uri, first row, ids, texts)`` Arrow arrays of each segment, read by row group (Parquet)."""
    import pyarrow.parquet as pq
    from batch_contract import storage

    for seg in segments:
        uri = spec.files[seg.file_index].uri
        fs, path = storage.arrow_filesystem(uri)
        with fs.open_input_file(path) as fh:
            pf = pq.ParquetFile(fh)
            start, groups = 0, []
            for g in range(pf.metadata.num_row_groups):
                n = pf.metadata.row_group(g).num_rows
                if start < seg.row_stop and start + n > seg.row_start:
                    groups.append((g, start))
                start += n
            table = pf.read_row_groups([g for g, _ in groups], columns=[spec.id_column, spec.text_column])
            lo = seg.row_start - groups[0][1]
            table = table.slice(lo, seg.row_stop - seg.row_start)
        yield uri, seg.row_start, table.column(0).combine_chunks(), table.column(1).combine_chunks()


def _write_one(args: tuple[str, list[str]]) -> int:
    """Write ``shard_ids`` of ``run_dir`` the way the worker commits them, without its per-row Python:
    the shard's rows read by the worker's reader, empty texts as ``empty_text`` dead letters, the rest
    answered by :class:`BenchEngine`'s rule, each through the worker's writer (``commit_table``:
    create-only zstd parts with the contract's encodings; ``dead_letter_table``), the attempt record, the
    progress object and the marker through the contract's run store, under the fingerprint the worker
    runtime computes for this run on this host."""
    import socket

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    from batch_contract import storage
    from batch_contract.enums import DeadLetterReason, ExitCode, ShardStatus
    from batch_contract.hostinfo import host_facts
    from batch_contract.layout import DEAD_LETTER_PREFIX, PART_PREFIX, join_uri
    from batch_contract.marker import AttemptRecord, ShardMarker, ShardProgress
    from batch_contract.schemas import part_schema
    from batch_worker import runtime
    from batch_worker.progress import utc_now
    from batch_worker.validate import DeadLetter
    from batch_worker.writer import commit_table, dead_letter_table
    from scale_engine import LABELS, BenchEngine

    runtime.engine_class = lambda kind: BenchEngine
    run_dir, shard_ids = args
    ctx = runtime.load_context(run_dir, shard_ids[0])
    manifest, fp, schema, facts = ctx.manifest, ctx.fingerprint, part_schema("classification"), host_facts()
    for sid in shard_ids:
        t0, c0 = time.perf_counter(), cpu_s()
        spec, shard_dir = manifest.shard(sid), ctx.layout.shard_dir(sid)
        attempt = AttemptRecord(attempt_id=runtime.new_attempt_id(), shard_id=sid, started_at=utc_now(),
                                host=socket.gethostname(), fingerprint=fp, host_facts=facts)
        parts, dead_parts, dead, tokens, truncated, rows_ok = [], [], [], 0, 0, 0
        for uri, first_row, ids, text in _segment_tables(manifest.input, spec.segments):
            lengths = pc.utf8_length(text).to_numpy(zero_copy_only=False)
            empty = lengths == 0
            for row in np.flatnonzero(empty):
                dead.append(DeadLetter(ids[int(row)].as_py(), DeadLetterReason.EMPTY_TEXT, "empty text",
                                       uri, first_row + int(row)))
            keep = pa.array(~empty)
            ok_ids, ok_len = ids.filter(keep), lengths[~empty]
            n_tokens = (ok_len // 4 + 1).astype(np.int32)
            table = pa.table({"id": ok_ids, "fingerprint": pa.array([fp] * len(ok_ids), pa.string()),
                              "n_tokens": pa.array(n_tokens), "truncated": pa.array(ok_len > 2048),
                              "text_repaired": pa.array(np.zeros(len(ok_ids), bool)),
                              "label": pa.array(np.array(LABELS, dtype=object)[ok_len % 3], pa.string()),
                              "score": pa.array(((ok_len % 97) / 97.0).astype(np.float32))}, schema=schema)
            name, digest = commit_table(shard_dir, PART_PREFIX, len(parts), table)
            parts.append(name)
            attempt.files[name] = digest
            tokens += int(n_tokens.sum())
            truncated += int((ok_len > 2048).sum())
            rows_ok += len(ok_ids)
        if dead:
            name, digest = commit_table(shard_dir, DEAD_LETTER_PREFIX, len(parts), dead_letter_table(dead, fp))
            dead_parts.append(name)
            attempt.files[name] = digest
        seconds = time.perf_counter() - t0
        attempt.status, attempt.exit_code, attempt.ended_at = ShardStatus.COMPLETE.value, int(ExitCode.OK), utc_now()
        attempt.rows_committed = attempt.rows_processed = spec.rows
        attempt.chunks_committed, attempt.tokens_real, attempt.tokens_padded = len(parts), tokens, tokens
        attempt.stage_seconds, attempt.cpu_seconds = {"inference": round(seconds, 3)}, round(cpu_s() - c0, 3)
        attempt.steady_rows_per_s = round(spec.rows / max(seconds, 1e-9), 2)
        storage.write_replace(join_uri(ctx.layout.attempts_dir(sid), f"{attempt.attempt_id}.json"),
                              attempt.to_json_bytes())
        record = json.loads(attempt.to_json_bytes())
        storage.write_replace(ctx.layout.progress_uri(sid), ShardProgress(
            shard_id=sid, status=ShardStatus.COMPLETE.value, rows_total=spec.rows, rows_done=spec.rows,
            rows_dead_letter=len(dead), rows_per_s=attempt.steady_rows_per_s, eta_s=0.0, updated_at=utc_now(),
            attempt_id=attempt.attempt_id).to_json_bytes())
        if rows_ok + len(dead) != spec.rows:
            raise RuntimeError(f"shard {sid}: {rows_ok} + {len(dead)} != {spec.rows}")
        marker = ShardMarker(
            run_id=manifest.run_id, shard_id=sid, fingerprint=fp, rows_input=spec.rows, rows_ok=rows_ok,
            rows_dead_letter=len(dead), rows_truncated=truncated,
            dead_letter_reasons={"empty_text": len(dead)} if dead else {}, tokens_real=tokens,
            tokens_padded=tokens, stage_seconds=dict(attempt.stage_seconds), steady_rows_per_s=attempt.steady_rows_per_s,
            cpu_seconds=attempt.cpu_seconds, engine={"engine": "bench-scale", "resolved": ctx.engine.resolved_settings()},
            attempts=[record], parts=parts, dead_letter_parts=dead_parts, files=dict(sorted(attempt.files.items())),
            host_facts=facts)
        marker.started_at, marker.finished_at = attempt.started_at, attempt.ended_at
        ctx.store.write_marker(marker)
    return 0


def stage_work(root: str, run_dir: str, procs: int, mode: str) -> dict[str, Any]:
    """Every shard, ``procs`` processes: through the worker runtime (``mode`` ``runtime``) or written
    the way it commits them (``direct``, :func:`_write_one`). What an earlier ``work`` stage of a kept
    local run wrote is removed first (part files have new names each time: a second pass would commit
    every row twice)."""
    import multiprocessing as mp

    from batch_contract.runstore import RunStore

    if "://" not in run_dir:
        shutil.rmtree(Path(run_dir) / "shards", ignore_errors=True)

    ids = [s.shard_id for s in RunStore.open(run_dir).manifest.shards]
    groups = [(run_dir, ids[i::procs]) for i in range(procs)]
    with mp.get_context("fork").Pool(procs) as pool:
        bad = sum(pool.map(_work_one if mode == "runtime" else _write_one, groups))
    if bad:
        raise RuntimeError(f"{bad} shard(s) did not complete")
    return {"processes": procs, "mode": mode}


class RequestCounter:
    """Counts storage requests: calls into the local backend, or HTTP requests seen by a proxy."""

    def __init__(self, proxy: Any = None) -> None:
        from batch_contract import storage

        self.proxy = proxy
        self.calls: dict[str, int] = {}
        if proxy is None:
            original = storage.backend_for
            counter = self

            class Counting:
                def __init__(self, inner: Any) -> None:
                    self._inner = inner

                def __getattr__(self, name: str) -> Any:
                    attr = getattr(self._inner, name)
                    if not callable(attr) or name in ("normalize", "capabilities"):
                        return attr

                    def call(*a: Any, **k: Any) -> Any:
                        counter.calls[name] = counter.calls.get(name, 0) + 1
                        return attr(*a, **k)
                    return call

            storage.backend_for = lambda uri: Counting(original(uri))

    def reset(self) -> None:
        self.calls.clear()
        if self.proxy is not None:
            self.proxy.seen.clear()

    def snapshot(self) -> dict[str, int]:
        if self.proxy is None:
            out = dict(self.calls)
            out["list"] = sum(v for k, v in self.calls.items() if k.startswith("list"))
            out["total"] = sum(self.calls.values())
            return out
        seen = list(self.proxy.seen)
        lists = [p for m, p, _ in seen if m == "GET" and p.split("?", 1)[0].rstrip("/").endswith("/o")]
        return {"total": len(seen), "list": len(lists),
                "get": sum(1 for m, _, _ in seen if m == "GET") - len(lists)}


def stage_gate(run_dir: str, counter: RequestCounter) -> dict[str, Any]:
    """Polls as the deferred gate makes them (:func:`batch_inference.completion.gate_check` on one store
    kept across polls): a first one that pays the process's imports, then a new trigger's first poll
    (cold: every marker read once) and its next one (warm)."""
    from batch_contract.runstore import RunStore
    from batch_inference.completion import gate_check

    t0 = time.perf_counter()  # the first poll of a triggerer process imports what polls use, once
    gate_check(RunStore.open(run_dir), 1.0)
    out: dict[str, Any] = {"first_poll_in_process_s": round(time.perf_counter() - t0, 3)}
    store = RunStore.open(run_dir)  # a new trigger: every marker is read once more
    _ = store.manifest  # read once when the trigger starts, not per poll
    for name in ("cold", "warm"):
        counter.reset()
        t0, c0 = time.perf_counter(), cpu_s()
        status, _line = gate_check(store, 1.0)
        out[f"poll_{name}_wall_s"] = round(time.perf_counter() - t0, 3)
        out[f"poll_{name}_cpu_s"] = round(cpu_s() - c0, 3)
        out[f"poll_{name}_requests"] = counter.snapshot()
        if not status.satisfied:
            raise RuntimeError(f"gate not satisfied: {len(status.missing)} shard(s) missing")
    return out


def stage_fanout(root: str, run_dir: str) -> dict[str, Any]:
    """Airflow's scheduler expands the plan into mapped task instances (``scale_fanout.measure``)."""
    import tempfile

    import scale_fanout

    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as work:
        return scale_fanout.measure(run_dir, Path(work))


def stage_publish(root: str, run_dir: str) -> dict[str, Any]:
    """Publish into DuckDB (coverage check, load, swap)."""
    from batch_inference.publish import PublishTarget, publish_run

    local = root if "://" not in root else str(REPO / "build" / "bench-scale-gcs")
    Path(local).mkdir(parents=True, exist_ok=True)
    summary = publish_run(run_dir, PublishTarget(backend="duckdb", table="scale",
                                                 duckdb_path=f"{local}/scale.duckdb"))
    Path(f"{local}/publish.json").write_text(json.dumps(summary))
    return {"rows_published": summary["rows_published"], "rows_dead_letter": summary.get("rows_dead_letter"),
            "rows_missing": summary.get("rows_missing"), "publish_seconds": summary["publish_seconds"],
            "rows_per_s": round(summary["rows_published"] / max(summary["publish_seconds"], 1e-9))}


def stage_report(root: str, run_dir: str) -> dict[str, Any]:
    """Build report.json + report.html."""
    from batch_inference.report.build import build_report

    local = root if "://" not in root else str(REPO / "build" / "bench-scale-gcs")
    summary = json.loads(Path(f"{local}/publish.json").read_text())
    report = build_report(run_dir, dag_id=DAG_ID, publish_summary=summary, cost_params=None)
    return {"report_json_bytes": len(json.dumps(report))}


def stage_ui(root: str, run_dir: str) -> dict[str, Any]:
    """The run page through the real app: cold (first request), then warm."""
    import pytest
    from ui.app_harness import UiHarness, allow_only, record, run_path

    mp = pytest.MonkeyPatch()
    allow_only(mp, root if "://" in root else Path(root))
    harness = UiHarness(mp, [record(DAG_ID, RUN_ID, run_dir)], {"alice": {(DAG_ID, None), (DAG_ID, "RUN")}})
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity

    harness.auth.grants = {"alice": {(DAG_ID, None), (DAG_ID, DagAccessEntity.RUN)}}
    out: dict[str, Any] = {}
    for name in ("cold", "warm"):
        t0 = time.perf_counter()
        resp = harness.get(run_path(DAG_ID, RUN_ID))
        out[f"run_page_{name}_s"] = round(time.perf_counter() - t0, 3)
        if resp.status_code != 200:
            raise RuntimeError(f"run page: HTTP {resp.status_code}: {resp.text[:300]}")
        out["run_page_bytes"] = len(resp.content)
        out["run_page_shard_rows"] = resp.text.count("data-shard=")
    mp.undo()
    return out


def stage_worker_exit(run_dir: str) -> dict[str, Any]:
    """``python -m batch_worker run`` on a complete shard, in a fresh interpreter."""
    code = ("import sys, time; t0 = time.perf_counter(); from batch_worker.cli import main; "
            f"rc = main(['run', '--run-dir', {run_dir!r}, '--shard', '00000']); "
            "print(rc, 'torch' in sys.modules, round(time.perf_counter() - t0, 3))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO / "worker_image")])}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    wall = time.perf_counter() - t0
    rc, torch, inner = proc.stdout.split()[-3:]
    return {"exit_code": int(rc), "torch_imported": torch == "True", "process_wall_s": round(wall, 3),
            "in_process_s": float(inner)}


# ----------------------------------------------------------------------------------------------- driver


def child(stage: str, args: argparse.Namespace) -> None:
    """Run one stage in this process; print ``{"wall_s", "cpu_s", "peak_rss_mb", ...}``."""
    proxy = None
    if args.root.startswith("gs://") and stage == "gate":  # requests counted by a proxy in front
        from gcs_fixture import FaultProxy

        proxy = FaultProxy(upstream=os.environ["BENCH_GCS_UPSTREAM"])
        os.environ["STORAGE_EMULATOR_HOST"] = proxy.url
    counter = RequestCounter(proxy) if stage == "gate" else None
    t0, c0 = time.perf_counter(), cpu_s()
    if stage == "generate":
        out = stage_generate(args.root, args.rows)
    elif stage == "plan":
        out = stage_plan(args.root, args.rows)
    elif stage == "fanout":
        out = stage_fanout(args.root, args.run_dir)
    elif stage == "work":
        out = stage_work(args.root, args.run_dir, args.procs, args.work)
    elif stage == "gate":
        out = stage_gate(args.run_dir, counter)
    elif stage == "publish":
        out = stage_publish(args.root, args.run_dir)
    elif stage == "report":
        out = stage_report(args.root, args.run_dir)
    elif stage == "ui":
        out = stage_ui(args.root, args.run_dir)
    elif stage == "worker_exit":
        out = stage_worker_exit(args.run_dir)
    else:
        raise SystemExit(f"unknown stage {stage}")
    wall = time.perf_counter() - t0
    out.update(wall_s=round(wall, 3), cpu_s=round(cpu_s() - c0, 3), peak_rss_mb=round(peak_rss_mb(), 1))
    if stage in ("work", "worker_exit"):  # the work is done in child processes: theirs (largest one)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        out.update(cpu_s=round(out["cpu_s"] + children.ru_utime + children.ru_stime, 3),
                   peak_rss_mb=round(max(out["peak_rss_mb"], children.ru_maxrss / 1024), 1))
    if proxy is not None:
        proxy.close()
    print(json.dumps(out))


def run_stage(stage: str, args: argparse.Namespace, run_dir: str = "") -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--stage", stage, "--rows", str(args.rows), "--root", args.root,
           "--run-dir", run_dir, "--procs", str(args.procs), "--work", args.work]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-8000:])
        raise SystemExit(f"stage {stage} failed (exit {proc.returncode})")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{stage}: {json.dumps(out)} ({time.perf_counter() - t0:.1f} s with start-up)", file=sys.stderr,
          flush=True)
    return out


def _start_gcs() -> tuple[Any, str]:
    from gcs_fixture import FakeGcsServer

    server = FakeGcsServer().start()
    bucket = server.create_bucket("bench-scale")
    os.environ["BENCH_GCS_UPSTREAM"] = server.url
    os.environ["STORAGE_EMULATOR_HOST"] = server.url
    return server, bucket


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=int(os.environ.get("SCALE_ROWS") or 40_000_000))
    parser.add_argument("--root", default=os.environ.get("SCALE_ROOT") or str(REPO / "build" / "bench-scale"))
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the generated data")
    parser.add_argument("--work", choices=("auto", "runtime", "direct"), default="auto",
                        help="how shards are written: the worker runtime (auto: up to 1M rows) or directly "
                             "through its writer and the contract (auto: above)")
    parser.add_argument("--from-stage", default="generate", choices=STAGES,
                        help="reuse the data a --keep run left and start at this stage")
    parser.add_argument("--until", default=STAGES[-1], choices=STAGES, help="stop after this stage")
    parser.add_argument("--stage", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stage:
        child(args.stage, args)
        return
    import hostbench

    if "://" not in args.root:
        args.root = str(Path(args.root).resolve())
    if args.work == "auto":
        args.work = "runtime" if args.rows <= 1_000_000 else "direct"
    server = None
    if args.root.startswith("gs://"):
        if args.from_stage != "generate":
            raise SystemExit("--from-stage needs a local root (the emulator keeps nothing)")
        server, bucket = _start_gcs()
        args.root = f"{bucket}/scale"
        state = REPO / "build" / "bench-scale-gcs" / "stages.json"
    else:
        state = Path(args.root) / "stages.json"
        if args.from_stage == "generate":
            shutil.rmtree(args.root, ignore_errors=True)
            Path(args.root).mkdir(parents=True)
    hostbench.start()
    stages: dict[str, dict[str, Any]] = json.loads(state.read_text()) if args.from_stage != "generate" else {}
    try:
        for stage in STAGES[STAGES.index(args.from_stage):STAGES.index(args.until) + 1]:
            stages[stage] = run_stage(stage, args, stages.get("plan", {}).get("run_dir", ""))
            state.parent.mkdir(parents=True, exist_ok=True)
            state.write_text(json.dumps(stages))
    finally:
        if server is not None:
            server.stop()
        if not args.keep:
            shutil.rmtree(args.root if "://" not in args.root else REPO / "build" / "bench-scale-gcs",
                          ignore_errors=True)
    if args.until != STAGES[-1]:
        print(json.dumps({"bench": "scale", "rows": args.rows, "stopped_after": args.until, "stages": stages}))
        return
    print(json.dumps(summarise(args, stages, hostbench.finish())))


def summarise(args: argparse.Namespace, st: dict[str, dict[str, Any]], host: dict[str, Any]) -> dict[str, Any]:
    """The last line: per-stage figures, the Done-when figures and whether each target is met."""
    gcs = args.root.startswith("gs://")
    figures = {
        "plan_wall_s": st["plan"]["wall_s"], "plan_peak_rss_mb": st["plan"]["peak_rss_mb"],
        "gate_poll_wall_s": max(st["gate"]["poll_cold_wall_s"], st["gate"]["poll_warm_wall_s"]),
        "publish_rows_per_s": st["publish"]["rows_per_s"], "publish_peak_rss_mb": st["publish"]["peak_rss_mb"],
        "report_wall_s": st["report"]["wall_s"],
        "ui_run_page_s": max(st["ui"]["run_page_cold_s"], st["ui"]["run_page_warm_s"]),
        "worker_exit_s": st["worker_exit"]["process_wall_s"],
    }
    if gcs:
        figures["gcs_gate_poll_list_requests"] = max(st["gate"]["poll_cold_requests"]["list"],
                                                     st["gate"]["poll_warm_requests"]["list"])
    met = {k: (v <= TARGETS[k] if k != "publish_rows_per_s" else v >= TARGETS[k]) for k, v in figures.items()}
    met["worker_exit_no_torch"] = not st["worker_exit"]["torch_imported"]
    return {"bench": "scale", "rows": args.rows, "shards": st["plan"]["shards"], "shards_asked": SHARDS, "storage": "gs (fake-gcs-server)" if gcs else "local",
            "input_files": st["generate"]["input_files"], "figures": figures, "targets": TARGETS, "met": met,
            "all_met": all(met.values()), "manifest_bytes": st["plan"]["manifest_bytes"],
            "xcom_refs_bytes": st["plan"]["xcom_refs_bytes"],
            "xcom_bytes_per_shard_task_max": st["plan"]["xcom_bytes_per_shard_task_max"],
            "fanout": {k: st["fanout"][k] for k in ("create_all_mapped_s", "infer_local_all_scheduled_s",
                                                   "infer_k8s_all_scheduled_s", "mapped_task_instances",
                                                   "infer_local_arg_bytes_max", "infer_k8s_kwargs_bytes_max",
                                                   "kpo_args_xcom_bytes")},
            "gate_requests": {"cold": st["gate"]["poll_cold_requests"], "warm": st["gate"]["poll_warm_requests"]},
            "stages": {k: {m: v.get(m) for m in ("wall_s", "cpu_s", "peak_rss_mb")} for k, v in st.items()},
            "details": st, "host": host, "cpu_cores": os.cpu_count(),
            "load_avg_1m_at_end": round(os.getloadavg()[0], 1)}


if __name__ == "__main__":
    main()
