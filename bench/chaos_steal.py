"""Chaos with work stealing (``worker.steal``): several shards' workers at once, killed at random while they
take each other's units, restarted until every one exits 0; then every input row is checked exactly once.

Used by ``bench/chaos.py --steal`` (``make chaos``) and ``tests/integration/test_stealing.py``.

A trial (:func:`run_steal_trial`): a run of ``shards`` shards with stealing on (short leases, small units);
one worker per shard started at once, except, when ``absent_owner``, the last shard's (a pod that never
gets scheduled: the others must compute it). At random moments a random running worker gets ``sig``;
a killed worker is started again (the orchestrator's retry) at once. The verdict
(:func:`check_steal_trial`): the union of every shard's committed outputs against the one-shard
uninterrupted reference (every id once, every bad row one dead letter, vectors within
``chaos_lib.COSINE_TOLERANCE``), every shard with a marker whose counts equal its committed rows.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import chaos_lib
from chaos_lib import ShardOutputs

STEAL_WORKER = {"steal": True, "steal_unit_rows": 1, "lease_seconds": 4.0}
"""Worker settings of the steal trials: 1-row units, so with 3 shards of 21 rows a claim takes up to 3
adjacent units (``claims.claim_units(21, 3)``), then 2, then 1 near a shard's end: chunks hold rows of
several units of one claim, and a kill can leave a claim's leases to expire together. 4 s leases, so a
SIGKILLed holder's units are taken over within seconds."""


@dataclass
class StealVerdict:
    """One steal trial against the reference (counts over the union of the run's shards).

    Attributes:
        lost_rows / duplicate_rows / unexpected_rows: as ``chaos_lib.TrialVerdict``.
        markers_ok: every shard has a marker whose counts equal that shard's committed rows.
        units_stolen: units computed by workers of other shards (the markers' ``steal.units_stolen``).
        absent_owner: one shard's worker never started.
        exit_codes: every process's exit code; ``killed_exit_codes``: those of the processes sent ``signal``.
        wrong_exits: processes whose exit code the contract does not allow (``chaos_lib.exit_code_ok``).
        completed: every started shard's worker exited 0 (false: the trial was given up).
        exact: all clean, no wrong exit, completed and ``min_cosine >= COSINE_TOLERANCE``.
    """

    trial: int
    signal: str
    kills: int
    starts: int
    lost_rows: int
    duplicate_rows: int
    unexpected_rows: int
    min_cosine: float
    markers_ok: bool
    units_stolen: int
    absent_owner: bool
    exact: bool
    seconds: float
    exit_codes: list[int] = field(default_factory=list)
    killed_exit_codes: list[int] = field(default_factory=list)
    wrong_exits: int = 0
    completed: bool = True


def _start(layout, shard_id: str, log_dir: Path, n: int) -> subprocess.Popen:
    log = open(log_dir / f"worker-{shard_id}-{n:02d}.log", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen([sys.executable, "-m", "batch_worker", "run", "--run-dir", layout.run_dir,
                             "--shard", shard_id], env=chaos_lib.worker_env(), stdout=log,
                            stderr=subprocess.STDOUT, cwd=chaos_lib.REPO_ROOT)


def run_steal_trial(layout, shards: int, sig: signal.Signals, rng: random.Random, *, max_kills: int = 2,
                    window_seconds: float = 10.0, absent_owner: bool = False, timeout: float = 600.0,
                    log_dir: Path | None = None) -> StealRun:
    """Run every shard's worker at once, kill random ones with ``sig``, restart them, until all exit 0.

    Args:
        layout: the run (manifest written with ``shards`` shards and stealing on).
        shards: number of shards.
        sig: ``signal.SIGKILL`` or ``signal.SIGTERM``.
        rng: source of kill moments and victims.
        max_kills: kills in the trial are drawn from ``1..max_kills``.
        window_seconds: each kill lands uniformly within this many seconds after the previous one
            (or the start).
        absent_owner: the last shard's worker is never started.
        timeout: seconds before the trial is given up (its workers SIGKILLed; not completed).
        log_dir: where worker logs go (default: the run dir).

    Returns:
        The trial's :class:`StealRun`: every process's exit code is recorded; a wrong one
        (``chaos_lib.exit_code_ok``) is counted and that shard's worker restarted, up to
        ``chaos_lib.MAX_WRONG_EXITS`` per trial, after which the trial is given up.
    """
    log_dir = log_dir or Path(layout.run_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    owners = chaos_lib.shard_ids(shards)[:-1] if absent_owner else chaos_lib.shard_ids(shards)
    t0 = time.monotonic()
    running = {sid: _start(layout, sid, log_dir, 0) for sid in owners}
    starts, codes, kills = len(running), [], 0
    kills_left = rng.randint(1, max_kills)
    next_kill = t0 + rng.uniform(0.5, window_seconds)
    killed: set[int] = set()
    killed_codes: list[int] = []
    wrong = 0
    while running:
        if time.monotonic() - t0 > timeout or wrong >= chaos_lib.MAX_WRONG_EXITS:
            for p in running.values():
                p.kill()
                p.wait()
            print(f"  steal trial given up ({wrong} wrong exits, {time.monotonic() - t0:.0f} s); logs in {log_dir}",
                  file=sys.stderr)
            return StealRun(kills, starts, codes, killed_codes, wrong, False, time.monotonic() - t0)
        if kills_left and time.monotonic() >= next_kill:
            sid = rng.choice(sorted(running))
            running[sid].send_signal(sig)
            killed.add(running[sid].pid)
            kills, kills_left = kills + 1, kills_left - 1
            next_kill = time.monotonic() + rng.uniform(0.5, window_seconds)
        for sid, proc in list(running.items()):
            code = proc.poll()
            if code is None:
                continue
            codes.append(code)
            sent = sig.name if proc.pid in killed else None
            if sent:
                killed_codes.append(code)
            if not chaos_lib.exit_code_ok(code, sent):
                wrong += 1
                print(f"  shard {sid}: wrong exit {code} after {sent or 'no signal'}; logs in {log_dir}",
                      file=sys.stderr)
            if code == 0:
                del running[sid]
            else:
                running[sid] = _start(layout, sid, log_dir, starts)
                starts += 1
        time.sleep(0.05)
    return StealRun(kills, starts, codes, killed_codes, wrong, True, time.monotonic() - t0)


@dataclass
class StealRun:
    """What :func:`run_steal_trial` saw: kills sent, processes started, every exit code (and those of the
    processes it signalled), wrong exits, whether every worker exited 0, wall seconds."""

    kills: int
    starts: int
    codes: list[int]
    killed_codes: list[int]
    wrong_exits: int
    completed: bool
    seconds: float


def union_outputs(layout, shards: int) -> tuple[ShardOutputs, list[ShardOutputs]]:
    """Every shard's committed outputs, and their union (counts added; markers left out)."""
    per = [chaos_lib.read_shard(layout.shard_dir(sid)) for sid in chaos_lib.shard_ids(shards)]
    union = ShardOutputs(id_counts=Counter(), dead_counts=Counter())
    for out in per:
        union.id_counts.update(out.id_counts)
        union.dead_counts.update(out.dead_counts)
        union.dead_reasons.update(out.dead_reasons)
        union.fingerprints |= out.fingerprints
        for rid, vec in out.vectors.items():
            union.vectors.setdefault(rid, vec)
    return union, per


def check_steal_trial(trial: int, sig: str, layout, shards: int, reference: ShardOutputs, run: StealRun,
                      absent_owner: bool) -> StealVerdict:
    """Compare one steal trial's committed outputs with the reference (see :class:`StealVerdict`)."""
    union, per = union_outputs(layout, shards)
    # dead letters by (file name, row): the trial may read the reference's file from another place (gs://)
    got_dead = Counter()
    for (uri, row), n in union.dead_counts.items():
        got_dead[(uri.rsplit("/", 1)[-1], row)] += n
    exp_ids, exp_dead = set(reference.id_counts), {(uri.rsplit("/", 1)[-1], row) for uri, row in reference.dead_counts}
    lost = len(exp_ids - set(union.id_counts)) + len(exp_dead - set(got_dead))
    dup = (sum(c - 1 for c in union.id_counts.values() if c > 1)
           + sum(c - 1 for c in got_dead.values() if c > 1))
    unexpected = len(set(union.id_counts) - exp_ids) + len(set(got_dead) - exp_dead)
    cos = chaos_lib.min_cosine(reference.vectors, union.vectors)
    markers_ok = all(o.marker is not None and o.marker.rows_ok == len(o.id_counts)
                     and o.marker.rows_dead_letter == len(o.dead_counts) for o in per)
    stolen = sum(int((o.marker.steal or {}).get("units_stolen", 0)) for o in per if o.marker is not None)
    exact = (lost == 0 and dup == 0 and unexpected == 0 and cos >= chaos_lib.COSINE_TOLERANCE and markers_ok
             and run.wrong_exits == 0 and run.completed)
    return StealVerdict(trial=trial, signal=sig, kills=run.kills, starts=run.starts, lost_rows=lost,
                        duplicate_rows=dup, unexpected_rows=unexpected, min_cosine=round(cos, 7),
                        markers_ok=markers_ok, units_stolen=stolen, absent_owner=absent_owner, exact=exact,
                        seconds=round(run.seconds, 2), exit_codes=run.codes, killed_exit_codes=run.killed_codes,
                        wrong_exits=run.wrong_exits, completed=run.completed)


def steal_summary(verdicts: list[StealVerdict]) -> dict[str, Any]:
    """Totals over steal trials (the ``steal`` object of ``bench/chaos.py``'s JSON line)."""
    return {
        "trials": len(verdicts),
        "exact_trials": sum(v.exact for v in verdicts),
        "lost_rows": sum(v.lost_rows for v in verdicts),
        "duplicate_rows": sum(v.duplicate_rows for v in verdicts),
        "unexpected_rows": sum(v.unexpected_rows for v in verdicts),
        "kills": sum(v.kills for v in verdicts),
        "kills_sigkill": sum(v.kills for v in verdicts if v.signal == "SIGKILL"),
        "kills_sigterm": sum(v.kills for v in verdicts if v.signal == "SIGTERM"),
        "trials_absent_owner": sum(v.absent_owner for v in verdicts),
        "units_stolen": sum(v.units_stolen for v in verdicts),
        "trials_with_stolen_units": sum(1 for v in verdicts if v.units_stolen),
        "min_cosine": min((v.min_cosine for v in verdicts), default=1.0),
        "sigterm_exit_codes": _code_counts(c for v in verdicts if v.signal == "SIGTERM" for c in v.killed_exit_codes),
        "sigkill_exit_codes": _code_counts(c for v in verdicts if v.signal == "SIGKILL" for c in v.killed_exit_codes),
        "wrong_exit_attempts": sum(v.wrong_exits for v in verdicts),
        "wrong_exit_trials": sum(1 for v in verdicts if v.wrong_exits),
        "incomplete_trials": sum(1 for v in verdicts if not v.completed),
    }


def _code_counts(codes: Iterable[int]) -> dict[str, int]:
    return dict(sorted(Counter(str(c) for c in codes).items()))
