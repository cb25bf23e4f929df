"""Crash/preemption chaos helpers shared by ``bench/chaos.py`` and the reliability tests.

Pieces:

* :func:`make_chaos_input` - a small Parquet shard of real Debian descriptions (plus a few rows that must
  become dead letters), so kills land in the middle of a shard within seconds.
* :func:`write_manifest` - a one-shard run (``manifest.json``) over that file, built with the contract.
* :func:`run_with_kills` - start ``python -m batch_worker run``, kill it (SIGKILL or SIGTERM) at random
  moments, restart, until an attempt exits 0; records what every attempt committed.
* :func:`read_shard` / :func:`check_trial` - the exactly-once checker: every expected id exactly once in
  part files, every bad row exactly once in dead letters, vectors equal to a reference within a cosine
  tolerance, and re-done work per kill (rows processed but not committed) at most one chunk.

Kill moments: a kill is armed either at a uniformly random time during start-up (before the attempt's
first commit), or after a random number of further chunk commits plus a uniformly random fraction of one
chunk's duration, so kills land before, between and inside chunks.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REPO_ROOT = Path(__file__).resolve().parents[1]
for _p in (REPO_ROOT / "plugins", REPO_ROOT / "worker_image"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from batch_contract import storage  # noqa: E402
from batch_contract.engine_config import WorkerSettings  # noqa: E402
from batch_contract.layout import DEAD_LETTER_PREFIX, PART_PREFIX, RunLayout, chunk_of, join_uri  # noqa: E402
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec  # noqa: E402
from batch_contract.marker import AttemptRecord, ShardMarker, ShardProgress  # noqa: E402

SAMPLE_PARQUET = REPO_ROOT / "data" / "sample" / "debian_descriptions_sample.parquet"
FULL_PARQUET = Path(os.environ.get("BATCH_FULL_PARQUET", REPO_ROOT.parent / "shared" / "data" / "debian_descriptions.parquet"))
"""The full 63,905-row corpus when present (``$BATCH_FULL_PARQUET``, default ``../shared/data/`` beside the
repository), else the bundled sample is used."""
SHARD = "00000"
COSINE_TOLERANCE = 0.9999
"""Minimum cosine similarity between a chaos run's vector and the uninterrupted reference (fp32). After a
kill the remaining rows form other batches (other padded lengths); with the attention mask this moves
fp32 values by float rounding only (measured min cosine: see ``docs/reliability.md``)."""

BAD_ROWS = (("chaos-empty", ""), ("chaos-blank", " \t\n "), ("chaos-null", None))
"""Rows appended to the chaos input that must each become exactly one dead letter."""


def worker_env() -> dict[str, str]:
    """Environment for a worker subprocess: the repo's packages on ``PYTHONPATH``, no model hub, and one
    intra-op thread unless ``OMP_NUM_THREADS`` is set (on a shared 2-core machine torch's default of one
    thread per core made inference ~10x slower under contention: 41.6 s vs 3.8 s for 60 rows)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    paths = [str(REPO_ROOT / "plugins"), str(REPO_ROOT / "worker_image")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


def make_chaos_input(path: Path, rows: int, seed: int = 0, source: Path | None = None,
                     max_chars: int = 400) -> pa.Table:
    """Write a Parquet file of ``rows`` real rows (id, text) plus :data:`BAD_ROWS`, shuffled; return it.

    Args:
        path: where to write the file.
        rows: good rows to sample (texts of 1..``max_chars`` characters, so chunks stay short on CPU).
        seed: sampling and shuffling seed.
        source: Parquet file with ``id`` and ``text`` columns (default: the bundled 6,000-row sample).
        max_chars: longest text kept, characters.

    Raises:
        ValueError: the source has fewer than ``rows`` eligible rows.
    """
    table = pq.read_table(source or SAMPLE_PARQUET, columns=["id", "text"])
    lengths = pc.utf8_length(table.column("text")).to_numpy(zero_copy_only=False)
    eligible = np.flatnonzero((lengths > 0) & (lengths <= max_chars))
    if len(eligible) < rows:
        raise ValueError(f"{source or SAMPLE_PARQUET}: only {len(eligible)} rows of <= {max_chars} chars, need {rows}")
    rng = np.random.default_rng(seed)
    picked = table.take(np.sort(rng.choice(eligible, size=rows, replace=False)))
    ids = [str(x) for x in picked.column("id").to_pylist()] + [r[0] for r in BAD_ROWS]
    texts = picked.column("text").to_pylist() + [r[1] for r in BAD_ROWS]
    order = rng.permutation(len(ids))
    out = pa.table({"id": pa.array([ids[i] for i in order], pa.string()),
                    "text": pa.array([texts[i] for i in order], pa.string())})
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(out, path)
    return out


def shard_ids(shards: int) -> list[str]:
    """Ids of a run of ``shards`` shards written by :func:`write_manifest`."""
    return [f"{i:05d}" for i in range(shards)]


def write_manifest(output_root: Path | str, run_id: str, input_path: Path, *, chunk_rows: int,
                   dtype: str = "float32", worker: dict[str, Any] | None = None,
                   engine: dict[str, Any] | None = None, input_uri: str | None = None,
                   shards: int = 1) -> RunLayout:
    """Write a run over all rows of ``input_path`` (Parquet, ``id``/``text``) in ``shards`` shards of
    consecutive rows (as equal as can be; one by default, :data:`SHARD`); return its layout.

    Args:
        output_root: output root (local path or ``gs://bucket/prefix``).
        run_id: run id (safe path segment).
        input_path: the Parquet input (a local copy: row counts are read from it).
        input_uri: where the worker reads the input (default ``input_path``; e.g. the same file
            uploaded to ``gs://``).
        chunk_rows: rows per committed chunk (``WorkerSettings.chunk_rows``).
        dtype: encoder dtype (``float32`` keeps results batch-independent up to rounding).
        worker: extra ``WorkerSettings`` fields.
        engine: extra encoder config fields.
    """
    meta = pq.ParquetFile(input_path).metadata
    f = InputFile(uri=input_uri or str(input_path), rows=meta.num_rows,
                  row_group_rows=[meta.row_group(g).num_rows for g in range(meta.num_row_groups)],
                  size_bytes=input_path.stat().st_size)
    settings = {"chunk_rows": chunk_rows, "progress_interval_seconds": 0.05, "grace_seconds": 20.0,
                "token_budget": 2048, **(worker or {})}
    manifest = Manifest(
        run_id=run_id,
        input=InputSpec(uri=f.uri, format="parquet", id_column="id", text_column="text", files=[f]),
        shards=[ShardSpec(shard_id=sid, segments=[Segment(0, f.rows * i // shards, f.rows * (i + 1) // shards)])
                for i, sid in enumerate(shard_ids(shards))],
        engine={"kind": "encoder", "dtype": dtype, **(engine or {})},
        worker=WorkerSettings(**settings),
    )
    layout = RunLayout(output_root=str(output_root), run_id=run_id)
    storage.write_replace(layout.manifest_uri, manifest.to_json_bytes())
    return layout


def run_worker(layout: RunLayout, env: dict[str, str] | None = None, timeout: float = 600.0) -> subprocess.CompletedProcess:
    """Run the shard once, uninterrupted, as a subprocess (``python -m batch_worker run``); output captured.

    Args:
        layout: the run.
        env: extra environment (e.g. ``STORAGE_EMULATOR_HOST``) on top of :func:`worker_env`.
        timeout: seconds before ``subprocess.TimeoutExpired``.
    """
    return subprocess.run(
        [sys.executable, "-m", "batch_worker", "run", "--run-dir", layout.run_dir, "--shard", SHARD],
        env={**worker_env(), **(env or {})}, capture_output=True, text=True, cwd=REPO_ROOT, timeout=timeout,
    )


# -- reading a shard's committed outputs ----------------------------------------------------------------


@dataclass
class ShardOutputs:
    """Everything committed in one shard directory.

    Attributes:
        id_counts: id -> number of part-file rows carrying it (1 everywhere when exactly once).
        vectors: id -> embedding (float32[dim]) from the first part file carrying it.
        dead_counts: (source_uri, source_row) -> number of dead-letter rows for that input row.
        dead_reasons: (source_uri, source_row) -> reason code.
        part_chunks: chunk number of every committed part file (duplicates = a chunk committed twice).
        fingerprints: distinct fingerprints seen in part and dead-letter files.
        marker: the ``_SUCCESS.json`` marker, or ``None``.
    """

    id_counts: Counter = field(default_factory=Counter)
    vectors: dict[str, np.ndarray] = field(default_factory=dict)
    dead_counts: Counter = field(default_factory=Counter)
    dead_reasons: dict[tuple[str, int], str] = field(default_factory=dict)
    part_chunks: list[int] = field(default_factory=list)
    fingerprints: set[str] = field(default_factory=set)
    marker: ShardMarker | None = None

    @property
    def rows(self) -> int:
        return sum(self.id_counts.values()) + sum(self.dead_counts.values())


def _read_parquet(uri: str) -> pa.Table:
    import io

    return pq.read_table(io.BytesIO(storage.read_bytes(uri)))


def read_shard(shard_dir: str) -> ShardOutputs:
    """Read every committed part and dead-letter file under ``shard_dir`` (local or ``gs://``)."""
    out = ShardOutputs()
    for name in storage.list_names(shard_dir):
        chunk = chunk_of(name)
        if chunk is None:
            continue
        table = _read_parquet(join_uri(shard_dir, name))
        out.fingerprints.update(table.column("fingerprint").unique().to_pylist())
        if name.startswith(PART_PREFIX):
            out.part_chunks.append(chunk)
            ids = table.column("id").to_pylist()
            out.id_counts.update(ids)
            if "embedding" in table.column_names:
                vecs = np.asarray(table.column("embedding").to_pylist(), dtype=np.float32)
                for i, rid in enumerate(ids):
                    out.vectors.setdefault(rid, vecs[i])
        elif name.startswith(DEAD_LETTER_PREFIX):
            for uri, row, reason in zip(table.column("source_uri").to_pylist(), table.column("source_row").to_pylist(),
                                        table.column("reason").to_pylist(), strict=True):
                out.dead_counts[(uri, row)] += 1
                out.dead_reasons[(uri, row)] = reason
    marker_uri = join_uri(shard_dir, "_SUCCESS.json")
    if storage.exists(marker_uri):
        out.marker = ShardMarker.from_json_bytes(storage.read_bytes(marker_uri))
    return out


def committed_rows(shard_dir: str) -> dict[str, int]:
    """Committed file name -> row count (Parquet footer only), for before/after snapshots of an attempt."""
    rows = {}
    for name in storage.list_names(shard_dir):
        if chunk_of(name) is not None:
            uri = join_uri(shard_dir, name)
            if storage.is_local(uri):
                rows[name] = pq.ParquetFile(storage.local_path(uri)).metadata.num_rows
            else:
                rows[name] = _read_parquet(uri).num_rows
    return rows


def min_cosine(reference: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> float:
    """Smallest cosine similarity between ``got[id]`` and ``reference[id]`` over ids in both (1.0 if none)."""
    common = sorted(set(reference) & set(got))
    if not common:
        return 1.0
    a = np.stack([reference[i] for i in common]).astype(np.float64)
    b = np.stack([got[i] for i in common]).astype(np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return float(cos.min())


def max_abs_diff(reference: dict[str, np.ndarray], got: dict[str, np.ndarray]) -> float:
    """Largest absolute element difference between matching vectors (0.0 if no id in common)."""
    common = sorted(set(reference) & set(got))
    if not common:
        return 0.0
    return float(max(np.abs(reference[i] - got[i]).max() for i in common))


# -- the kill loop ----------------------------------------------------------------------------------------


@dataclass
class AttemptOutcome:
    """One worker start as the chaos loop saw it.

    Attributes:
        signal: ``SIGKILL``/``SIGTERM`` if the loop killed it, else ``None``.
        exit_code: the process's return code (negative: killed by that signal number).
        seconds: wall time of the process, seconds.
        committed_before: rows committed in the shard before it started.
        committed_rows: rows it committed (new committed files, counted from Parquet footers).
        processed_rows: rows it put through the engine (attempt record, or its last progress object when
            it was SIGKILLed before rewriting the record); ``None`` if it died before writing either.
        rework_rows: ``processed_rows`` minus the rows it committed as results (work lost to the kill and
            re-done later). A batch killed inside the forward pass never counted as processed: that
            part of the lost work is bounded by one chunk by construction (one commit per chunk).
        skipped_resume: rows its ledger skipped as already committed (from its attempt record).
        kill_phase: ``startup`` (armed before any commit) or ``mid-shard``.
        exit_ok: the exit code is the contract's for what was sent (:func:`exit_code_ok`).
        hung: the attempt ran past the loop's timeout and was SIGKILLed by the loop (``exit_ok`` false).
        handler_installed: for a SIGTERM, whether the process had a SIGTERM handler when it was sent
            (:func:`handles_sigterm`; ``None``: no SIGTERM sent, or not readable), which tells a wrong exit
            in the interpreter's own start-up from one after.
    """

    signal: str | None
    exit_code: int
    seconds: float
    committed_before: int
    committed_rows: int
    processed_rows: int | None
    rework_rows: int
    skipped_resume: int | None
    kill_phase: str | None = None
    exit_ok: bool = True
    hung: bool = False
    handler_installed: bool | None = None


def handles_sigterm(pid: int) -> bool | None:
    """Whether process ``pid`` has a SIGTERM handler installed (the ``SigCgt`` mask of
    ``/proc/<pid>/status``, Linux); ``None`` when it cannot be read (gone, or no ``/proc``)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return None


EXPECTED_EXIT_CODES = {None: {0}, "SIGTERM": {75, 0}, "SIGKILL": {-9, 0}}
"""The exit codes the worker's contract allows an attempt, by the signal the loop sent it (``None``: none):
SIGTERM -> 75 (finished chunks committed), or 0 when the shard was complete before the signal was
handled; SIGKILL -> -9, or 0 when it exited on its own first; no signal -> 0. Anything else (-15: the
signal's default action, i.e. no handler; -6: an abort at exit; 1: a failure) is a wrong exit."""

MAX_WRONG_EXITS = 3
"""Wrong exits after which :func:`run_with_kills` gives the trial up (counted as incomplete, not raised)."""


def exit_code_ok(code: int, sig: str | None) -> bool:
    """Whether exit code ``code`` is allowed after sending ``sig`` (:data:`EXPECTED_EXIT_CODES`)."""
    return code in EXPECTED_EXIT_CODES[sig]


def _attempt_records(layout: RunLayout) -> dict[str, AttemptRecord]:
    adir = layout.attempts_dir(SHARD)
    out = {}
    for name in storage.list_names(adir):
        if name.endswith(".json"):
            rec = AttemptRecord.from_json_bytes(storage.read_bytes(join_uri(adir, name)))
            out[rec.attempt_id] = rec
    return out


def _progress(layout: RunLayout) -> ShardProgress | None:
    try:
        return ShardProgress.from_json_bytes(storage.read_bytes(layout.progress_uri(SHARD)))
    except (FileNotFoundError, ValueError):
        return None


def _wait_or_kill(proc: subprocess.Popen, shard_dir: str, start_files: int, kill_after_commits: int | None,
                  extra_delay: float, startup_delay: float | None, poll: float = 0.02) -> tuple[bool, str | None]:
    """Wait for the kill moment; returns (kill now?, phase). ``False`` when the process exited first."""
    t0 = time.monotonic()
    armed_at: float | None = None
    while proc.poll() is None:
        now = time.monotonic()
        if startup_delay is not None:
            if now - t0 >= startup_delay:
                return True, "startup"
        elif armed_at is None:
            n = sum(1 for x in storage.list_names(shard_dir) if chunk_of(x) is not None)
            if n - start_files >= (kill_after_commits or 0):
                armed_at = now
        elif now - armed_at >= extra_delay:
            return True, "mid-shard"
        time.sleep(poll)
    return False, None


def run_with_kills(layout: RunLayout, sig: signal.Signals, rng: random.Random, *, max_kills: int = 3,
                   chunk_seconds: float = 1.0, startup_kill_prob: float = 0.2, startup_seconds: float = 6.0,
                   timeout: float = 600.0, log_dir: Path | None = None) -> list[AttemptOutcome]:
    """Run the shard, killing the worker with ``sig`` up to ``max_kills`` times, until an attempt exits 0.

    Args:
        layout: the run (manifest already written; one shard, :data:`SHARD`).
        sig: ``signal.SIGKILL`` or ``signal.SIGTERM``.
        rng: source of the kill moments.
        max_kills: kills before the worker is left to finish; the number of kills is drawn from
            ``1..max_kills``.
        chunk_seconds: typical seconds per chunk (the mid-chunk delay is drawn from ``[0, chunk_seconds)``).
        startup_kill_prob: probability that a kill is armed at a random moment of start-up instead.
        startup_seconds: the start-up window for such kills, seconds.
        timeout: seconds an attempt may run before the loop SIGKILLs it and gives the trial up.
        log_dir: where attempt stderr logs go (default: the run dir).

    Returns:
        One :class:`AttemptOutcome` per start, every exit code recorded. The last one exited 0 (the shard
        completed) unless the trial was given up: an attempt hung, or :data:`MAX_WRONG_EXITS` attempts
        exited with a code the contract does not allow (a wrong exit is recorded and the shard
        restarted, as an orchestrator would retry it).
    """
    shard_dir = layout.shard_dir(SHARD)
    storage.makedirs(shard_dir)
    kills_left = rng.randint(1, max_kills)
    outcomes: list[AttemptOutcome] = []
    log_dir = log_dir or Path(layout.run_dir)
    while True:
        before = committed_rows(shard_dir)
        known = set(_attempt_records(layout))
        log_path = log_dir / f"attempt-{len(outcomes):02d}.log"
        with open(log_path, "wb") as log_fh:
            t0 = time.monotonic()
            proc = subprocess.Popen(
                [sys.executable, "-m", "batch_worker", "run", "--run-dir", layout.run_dir, "--shard", SHARD],
                env=worker_env(), stdout=log_fh, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
            )
            killed, phase, handler = False, None, None
            if kills_left > 0:
                startup = rng.uniform(0.0, startup_seconds) if rng.random() < startup_kill_prob else None
                killed, phase = _wait_or_kill(proc, shard_dir, len(before), rng.randint(1, 2),
                                              rng.uniform(0.0, chunk_seconds), startup)
                if killed:
                    handler = handles_sigterm(proc.pid) if sig == signal.SIGTERM else None
                    proc.send_signal(sig)
                    kills_left -= 1
            hung = False
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                code, hung = proc.wait(), True
            seconds = time.monotonic() - t0
        outcome = _outcome(layout, shard_dir, before, known, sig if killed else None, code, seconds, phase)
        outcome.exit_ok = not hung and exit_code_ok(code, outcome.signal)
        outcome.hung = hung
        outcome.handler_installed = handler
        outcomes.append(outcome)
        if not outcome.exit_ok:
            print(f"  attempt {len(outcomes) - 1}: wrong exit {code} after {outcome.signal or 'no signal'}"
                  f"{' (hung, killed by the loop)' if hung else ''}; log {log_path}", file=sys.stderr)
        if code == 0 and not hung:
            return outcomes
        if hung or sum(not o.exit_ok for o in outcomes) >= MAX_WRONG_EXITS:
            return outcomes


def _outcome(layout: RunLayout, shard_dir: str, before: dict[str, int], known: set[str],
             sig: signal.Signals | None, code: int, seconds: float, phase: str | None) -> AttemptOutcome:
    after = committed_rows(shard_dir)
    new_rows = sum(n for name, n in after.items() if name not in before)
    # rows that went through the engine and were committed as results (validator dead letters never
    # reach the engine, so they are not in ``rows_processed``)
    new_results = sum(n for name, n in after.items() if name not in before and name.startswith(PART_PREFIX))
    records = _attempt_records(layout)
    mine = [records[a] for a in sorted(set(records) - known)]
    processed = skipped = None
    if mine:
        rec = mine[-1]
        processed, skipped = rec.rows_processed, rec.rows_skipped_resume
        prog = _progress(layout)
        if rec.exit_code is None and prog is not None and prog.attempt_id == rec.attempt_id:
            # SIGKILLed: the record is from the last commit; progress also counts rows in flight
            in_flight = prog.rows_done - sum(before.values()) - new_rows
            processed = max(processed, new_results + max(in_flight, 0))
    rework = max((processed or 0) - new_results, 0)
    return AttemptOutcome(
        signal=sig.name if sig is not None else None, exit_code=code, seconds=round(seconds, 3),
        committed_before=sum(before.values()), committed_rows=new_rows, processed_rows=processed,
        rework_rows=rework, skipped_resume=skipped, kill_phase=phase,
    )


# -- verdict ----------------------------------------------------------------------------------------------


@dataclass
class TrialVerdict:
    """Result of one chaos trial against the reference.

    Attributes:
        lost_rows: expected rows (results + dead letters) with no committed output.
        duplicate_rows: extra committed copies of a row (part files and dead letters).
        unexpected_rows: committed ids / dead letters that are not in the expected sets.
        min_cosine: smallest cosine similarity to the reference vectors.
        max_abs_diff: largest element difference to the reference vectors.
        max_rework_chunks: most chunks of re-done work caused by one kill (ceil(rework_rows / chunk_rows)).
        resume_mismatches: attempts whose ledger skipped a different number of rows than were committed.
        marker_ok: the marker exists and its counts equal the committed rows.
        wrong_exits: attempts whose exit code the contract does not allow (``AttemptOutcome.exit_ok``).
        completed: an attempt exited 0 (false: the loop gave the trial up).
        exact: all of the above clean and ``min_cosine >= COSINE_TOLERANCE``.
    """

    trial: int
    signal: str
    kills: int
    kills_mid_shard: int
    attempts: int
    lost_rows: int
    duplicate_rows: int
    unexpected_rows: int
    min_cosine: float
    max_abs_diff: float
    max_rework_chunks: int
    rework_rows: int
    resume_mismatches: int
    marker_ok: bool
    exact: bool
    seconds: float
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    wrong_exits: int = 0
    completed: bool = True


def check_trial(trial: int, sig: str, outputs: ShardOutputs, reference: ShardOutputs,
                outcomes: list[AttemptOutcome], chunk_rows: int) -> TrialVerdict:
    """Compare one trial's committed outputs with the reference run (see :class:`TrialVerdict`)."""
    exp_ids, exp_dead = set(reference.id_counts), set(reference.dead_counts)
    lost = len(exp_ids - set(outputs.id_counts)) + len(exp_dead - set(outputs.dead_counts))
    dup = sum(c - 1 for c in outputs.id_counts.values() if c > 1) + sum(c - 1 for c in outputs.dead_counts.values() if c > 1)
    unexpected = len(set(outputs.id_counts) - exp_ids) + len(set(outputs.dead_counts) - exp_dead)
    cos = min_cosine(reference.vectors, outputs.vectors)
    rework_chunks = max((math.ceil(o.rework_rows / chunk_rows) for o in outcomes if o.signal), default=0)
    # an attempt killed before its first chunk never reports a skip count (it stays 0): only attempts
    # that committed something or completed are checked
    mismatches = sum(1 for o in outcomes if o.skipped_resume is not None and (o.committed_rows or o.exit_code == 0)
                     and o.skipped_resume != o.committed_before)
    m = outputs.marker
    marker_ok = m is not None and m.rows_ok == len(outputs.id_counts) and m.rows_dead_letter == len(outputs.dead_counts)
    wrong = sum(1 for o in outcomes if not o.exit_ok)
    completed = bool(outcomes) and outcomes[-1].exit_code == 0 and not outcomes[-1].hung
    exact = (lost == 0 and dup == 0 and unexpected == 0 and cos >= COSINE_TOLERANCE and rework_chunks <= 1
             and mismatches == 0 and marker_ok and wrong == 0 and completed)
    return TrialVerdict(
        trial=trial, signal=sig, kills=sum(1 for o in outcomes if o.signal),
        kills_mid_shard=sum(1 for o in outcomes if o.kill_phase == "mid-shard" and o.committed_before + o.committed_rows < outputs.rows),
        attempts=len(outcomes), lost_rows=lost, duplicate_rows=dup, unexpected_rows=unexpected,
        min_cosine=round(cos, 7), max_abs_diff=float(f"{max_abs_diff(reference.vectors, outputs.vectors):.3g}"),
        max_rework_chunks=rework_chunks, rework_rows=sum(o.rework_rows for o in outcomes),
        resume_mismatches=mismatches, marker_ok=marker_ok, exact=exact,
        seconds=round(sum(o.seconds for o in outcomes), 2), outcomes=[asdict(o) for o in outcomes],
        wrong_exits=wrong, completed=completed,
    )


def run_reference(root: Path, input_path: Path, chunk_rows: int, run_id: str = "reference",
                  dtype: str = "float32") -> tuple[ShardOutputs, float]:
    """One uninterrupted run of the shard; returns its outputs and wall seconds.

    Raises:
        RuntimeError: the worker did not exit 0 (the message carries the log tail).
    """
    layout = write_manifest(root, run_id, input_path, chunk_rows=chunk_rows, dtype=dtype)
    t0 = time.monotonic()
    proc = run_worker(layout)
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"reference run exited {proc.returncode}: {proc.stderr[-2000:]}")
    return read_shard(layout.shard_dir(SHARD)), seconds


def exit_code_counts(verdicts: list[TrialVerdict], sig: str | None) -> dict[str, int]:
    """Exit code (as a string, JSON keys) -> attempts that exited with it, over the attempts the loop sent
    ``sig`` (``None``: attempts it sent nothing), every attempt of every trial."""
    counts = Counter(str(o["exit_code"]) for v in verdicts for o in v.outcomes if o["signal"] == sig)
    return dict(sorted(counts.items()))


def summary_json(verdicts: list[TrialVerdict], reference_seconds: float, extra: dict[str, Any]) -> str:
    """The benchmark's last line: totals over trials, as one JSON object."""
    chaos_seconds = [v.seconds for v in verdicts]
    return json.dumps({
        "trials": len(verdicts),
        "exact_trials": sum(v.exact for v in verdicts),
        "lost_rows": sum(v.lost_rows for v in verdicts),
        "duplicate_rows": sum(v.duplicate_rows for v in verdicts),
        "unexpected_rows": sum(v.unexpected_rows for v in verdicts),
        "max_rework_chunks": max((v.max_rework_chunks for v in verdicts), default=0),
        "kills": sum(v.kills for v in verdicts),
        "kills_sigkill": sum(v.kills for v in verdicts if v.signal == "SIGKILL"),
        "kills_sigterm": sum(v.kills for v in verdicts if v.signal == "SIGTERM"),
        "kills_mid_shard": sum(v.kills_mid_shard for v in verdicts),
        "trials_without_kill": sum(1 for v in verdicts if v.kills == 0),
        "resume_mismatches": sum(v.resume_mismatches for v in verdicts),
        "min_cosine": min((v.min_cosine for v in verdicts), default=1.0),
        "max_abs_diff": max((v.max_abs_diff for v in verdicts), default=0.0),
        "cosine_tolerance": COSINE_TOLERANCE,
        "sigterm_exit_codes": exit_code_counts(verdicts, "SIGTERM"),
        "sigkill_exit_codes": exit_code_counts(verdicts, "SIGKILL"),
        "unkilled_exit_codes": exit_code_counts(verdicts, None),
        "wrong_exit_attempts": sum(v.wrong_exits for v in verdicts),
        "wrong_exit_trials": sum(1 for v in verdicts if v.wrong_exits),
        "sigterm_before_handler": sum(1 for v in verdicts for o in v.outcomes
                                      if o["signal"] == "SIGTERM" and o.get("handler_installed") is False),
        "incomplete_trials": sum(1 for v in verdicts if not v.completed),
        "time_ratio_vs_uninterrupted": round(float(np.mean(chaos_seconds)) / reference_seconds, 3) if verdicts else None,
        **extra,
    })


# -- kill-once wrapper (orchestrator-level chaos) ---------------------------------------------------------


def kill_once_main(argv: list[str]) -> int:
    """``python bench/chaos_lib.py kill-once --flag-dir D [--after-commits N] [--signal KILL|TERM] -- ARGS``.

    A stand-in for a preempted pod, used as the local runner's ``BATCH_WORKER_COMMAND``: runs
    ``python -m batch_worker ARGS`` (``ARGS`` = ``run --run-dir R --shard S``, appended by the runner) and,
    the first time it sees this run + shard (no flag file in ``D``), kills the worker with the signal
    once N new part/dead-letter files are committed, exiting ``128 + signal`` like a killed container.
    Later calls, and commands without ``--shard`` (the pre-flight canary), run the worker untouched.

    Returns:
        The worker's exit code (``128 + n`` when it died of signal ``n``).
    """
    import argparse

    if "--" not in argv:
        raise SystemExit("usage: chaos_lib.py kill-once --flag-dir D [--after-commits N] [--signal KILL|TERM] -- ARGS")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="chaos_lib.py kill-once")
    parser.add_argument("--flag-dir", type=Path, required=True)
    parser.add_argument("--after-commits", type=int, default=1)
    parser.add_argument("--signal", choices=["KILL", "TERM"], default="KILL")
    opts = parser.parse_args(argv[:split])
    rest = argv[split + 1:]
    if "--shard" not in rest:  # not a shard run (``batch-worker canary``): run it untouched
        return subprocess.call([sys.executable, "-m", "batch_worker", *rest], env=worker_env())
    run_dir, shard_id = rest[rest.index("--run-dir") + 1], rest[rest.index("--shard") + 1]
    layout = RunLayout.from_run_dir(run_dir)
    flag = opts.flag_dir / f"{layout.run_id}-{shard_id}.killed"
    cmd = [sys.executable, "-m", "batch_worker", *rest]
    if flag.exists():
        return subprocess.call(cmd, env=worker_env())
    opts.flag_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(cmd, env=worker_env())
    shard_dir = layout.shard_dir(shard_id)
    before = len(committed_rows(shard_dir)) if storage.exists(shard_dir) else 0
    killed = False
    while proc.poll() is None:
        if storage.exists(shard_dir) and len(committed_rows(shard_dir)) - before >= opts.after_commits:
            proc.send_signal(getattr(signal, f"SIG{opts.signal}"))
            killed = True
            break
        time.sleep(0.05)
    code = proc.wait()
    # counted after the process is gone: exactly what the killed attempt (and earlier ones) committed
    at_kill = sum(committed_rows(shard_dir).values()) if storage.exists(shard_dir) else 0
    flag.write_text(json.dumps({"killed": killed, "exit_code": code, "files_before": before,
                                "rows_committed_at_exit": at_kill}))
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "kill-once":
        sys.exit(kill_once_main(sys.argv[2:]))
    raise SystemExit("usage: chaos_lib.py kill-once ... (see kill_once_main)")
