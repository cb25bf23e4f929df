"""Crash/preemption chaos benchmark: kill a shard's worker at random moments until it completes.

``python bench/chaos.py --trials 50`` (``make chaos``): builds a small shard of real Debian descriptions
(plus rows that must become dead letters), runs it once uninterrupted (the reference), then runs N trials
in fresh run directories, each killed 1..``--max-kills`` times (SIGKILL in even trials, SIGTERM in odd
ones) and restarted until an attempt exits 0. Every trial is checked against the reference: every id
exactly once, every bad row exactly once as a dead letter, vectors within ``COSINE_TOLERANCE`` (fp32),
re-done work per kill at most one chunk, each restart's ledger skipping exactly the committed rows, and a
marker whose counts match. Every attempt's exit code is recorded and checked against the worker's
contract (``chaos_lib.EXPECTED_EXIT_CODES``: after SIGTERM 75, or 0 when the shard was already complete;
after SIGKILL -9; unsignalled 0): a wrong one makes the trial inexact and the shard is restarted, as an
orchestrator would; a hung attempt, or ``chaos_lib.MAX_WRONG_EXITS`` wrong ones, gives the trial up
(``incomplete_trials``). No trial outcome stops the bench. One line per trial on stderr; the LAST stdout
line is one JSON object: ``trials, exact_trials, lost_rows, duplicate_rows, max_rework_chunks`` plus kill
counts, the worst cosine, ``sigterm_exit_codes`` / ``sigkill_exit_codes`` / ``unkilled_exit_codes`` (exit
code -> attempts), ``wrong_exit_attempts``, ``wrong_exit_trials``, ``incomplete_trials``,
``sigterm_before_handler`` (SIGTERMs sent before the process had installed its handler: the
interpreter's own start-up) and
``time_ratio_vs_uninterrupted`` (mean trial wall time / reference wall time, same process).

``--steal`` (``make chaos``'s second step): the same rows in ``--shards`` shards with work stealing on
(``bench/chaos_steal.py``): every shard's worker at once, random ones killed and restarted while they take
each other's units, in every fourth trial one shard's worker never started; each trial is checked over
the union of the shards (every id once, every bad row one dead letter, vectors within tolerance, a marker
per shard matching its rows). Its JSON line: the same totals (``trials``, ``exact_trials``,
``lost_rows``, ``duplicate_rows``, ..., the exit-code counts of the signalled workers and the wrong and
incomplete counts) plus ``units_stolen``, ``trials_absent_owner`` and ``time_ratio_vs_uninterrupted``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import chaos_lib  # noqa: E402
import chaos_steal  # noqa: E402
import hostbench  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=50, help="chaos trials (default 50)")
    parser.add_argument("--rows", type=int, default=60, help="good rows in the shard (default 60)")
    parser.add_argument("--chunk-rows", type=int, default=6, help="rows per committed chunk (default 6)")
    parser.add_argument("--max-kills", type=int, default=2, help="most kills per trial (default 2)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="encoder dtype for the reference and the trials (default float32)")
    parser.add_argument("--seed", type=int, default=0, help="seed for rows and kill moments (default 0)")
    parser.add_argument("--source", type=Path, default=None,
                        help="Parquet with id/text (default: data/sample/debian_descriptions_sample.parquet)")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep run dirs here (default: a temp dir)")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="seconds after which no new trial starts (the JSON then says how many ran)")
    parser.add_argument("--details", type=Path, default=None, help="write every trial's verdict here (JSON)")
    parser.add_argument("--steal", action="store_true",
                        help="chaos with work stealing: --shards workers at once (bench/chaos_steal.py)")
    parser.add_argument("--shards", type=int, default=3, help="shards of a --steal trial (default 3)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    hostbench.start()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    input_path = work / "input.parquet"
    chaos_lib.make_chaos_input(input_path, args.rows, seed=args.seed, source=args.source)
    reference, ref_seconds = chaos_lib.run_reference(work / "ref", input_path, args.chunk_rows, dtype=args.dtype)
    marker = reference.marker
    assert marker is not None
    chunks = -(-marker.rows_input // args.chunk_rows)
    chunk_seconds = max(marker.stage_seconds.get("inference", 1.0) / max(chunks, 1), 0.05)
    startup_seconds = max(ref_seconds - marker.stage_seconds.get("inference", 0.0), 1.0)
    print(f"reference: {marker.rows_ok} results + {marker.rows_dead_letter} dead letters in {ref_seconds:.1f} s "
          f"({chunks} chunks, ~{chunk_seconds:.2f} s/chunk, start-up ~{startup_seconds:.1f} s)", file=sys.stderr)
    rng = random.Random(args.seed)
    if args.steal:
        return steal_trials(args, work, input_path, reference, ref_seconds, rng, startup_seconds)
    verdicts = []
    t0 = time.monotonic()
    for trial in range(args.trials):
        if args.time_budget is not None and time.monotonic() - t0 > args.time_budget:
            print(f"time budget of {args.time_budget:.0f} s spent after {trial} trials", file=sys.stderr)
            break
        sig = signal.SIGKILL if trial % 2 == 0 else signal.SIGTERM
        root = work / f"trial-{trial:03d}"
        layout = chaos_lib.write_manifest(root, "chaos", input_path, chunk_rows=args.chunk_rows, dtype=args.dtype)
        outcomes = chaos_lib.run_with_kills(layout, sig, rng, max_kills=args.max_kills, chunk_seconds=chunk_seconds,
                                            startup_seconds=startup_seconds)
        outputs = chaos_lib.read_shard(layout.shard_dir(chaos_lib.SHARD))
        verdict = chaos_lib.check_trial(trial, sig.name, outputs, reference, outcomes, args.chunk_rows)
        verdicts.append(verdict)
        print(f"trial {trial:3d} {sig.name:7s} kills={verdict.kills} attempts={verdict.attempts} "
              f"lost={verdict.lost_rows} dup={verdict.duplicate_rows} rework_chunks={verdict.max_rework_chunks} "
              f"cos={verdict.min_cosine:.7f} exits={[o['exit_code'] for o in verdict.outcomes]} "
              f"wrong_exits={verdict.wrong_exits} exact={verdict.exact} ({verdict.seconds:.1f} s)", file=sys.stderr)
        if args.work_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    if args.details:
        args.details.write_text(json.dumps([asdict(v) for v in verdicts], indent=1))
    extra = {"trials_requested": args.trials, "dtype": args.dtype, "rows": args.rows + len(chaos_lib.BAD_ROWS), "chunk_rows": args.chunk_rows,
             "reference_seconds": round(ref_seconds, 2), "chaos_seconds": round(time.monotonic() - t0, 1), "host": hostbench.finish()}
    print(chaos_lib.summary_json(verdicts, ref_seconds, extra))
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(v.exact for v in verdicts) else 1


def steal_trials(args: argparse.Namespace, work: Path, input_path: Path, reference: chaos_lib.ShardOutputs,
                 ref_seconds: float, rng: random.Random, startup_seconds: float) -> int:
    """The ``--steal`` trials (see the module docstring); prints one line per trial and the JSON line."""
    verdicts = []
    t0 = time.monotonic()
    for trial in range(args.trials):
        if args.time_budget is not None and time.monotonic() - t0 > args.time_budget:
            print(f"time budget of {args.time_budget:.0f} s spent after {trial} trials", file=sys.stderr)
            break
        sig = signal.SIGKILL if trial % 2 == 0 else signal.SIGTERM
        absent = trial % 4 == 3
        root = work / f"steal-{trial:03d}"
        layout = chaos_lib.write_manifest(root, "chaos", input_path, chunk_rows=args.chunk_rows, dtype=args.dtype,
                                          shards=args.shards, worker=chaos_steal.STEAL_WORKER)
        run = chaos_steal.run_steal_trial(
            layout, args.shards, sig, rng, max_kills=args.max_kills, window_seconds=startup_seconds + ref_seconds / 2,
            absent_owner=absent)
        v = chaos_steal.check_steal_trial(trial, sig.name, layout, args.shards, reference, run, absent)
        verdicts.append(v)
        print(f"steal trial {trial:3d} {sig.name:7s} kills={v.kills} starts={v.starts} absent_owner={absent} "
              f"lost={v.lost_rows} dup={v.duplicate_rows} stolen_units={v.units_stolen} cos={v.min_cosine:.7f} "
              f"markers_ok={v.markers_ok} killed_exits={v.killed_exit_codes} wrong_exits={v.wrong_exits} "
              f"exact={v.exact} ({v.seconds:.1f} s)", file=sys.stderr)
        if args.work_dir is None:
            shutil.rmtree(root, ignore_errors=True)
    if args.details:
        args.details.write_text(json.dumps([asdict(v) for v in verdicts], indent=1))
    summary = chaos_steal.steal_summary(verdicts)
    mean = sum(v.seconds for v in verdicts) / len(verdicts) if verdicts else None
    summary.update({"mode": "steal", "shards": args.shards, "trials_requested": args.trials, "dtype": args.dtype,
                    "rows": args.rows + len(chaos_lib.BAD_ROWS), "chunk_rows": args.chunk_rows,
                    "worker": chaos_steal.STEAL_WORKER, "reference_seconds": round(ref_seconds, 2),
                    "time_ratio_vs_uninterrupted": round(mean / ref_seconds, 3) if mean else None,
                    "chaos_seconds": round(time.monotonic() - t0, 1), "host": hostbench.finish()})
    print(json.dumps(summary))
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if verdicts and all(v.exact for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
