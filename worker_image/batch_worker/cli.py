"""``batch-worker`` command line (also ``python -m batch_worker``)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import NoReturn

from batch_contract.engine_config import ConfigError
from batch_contract.enums import ExitCode

from batch_worker import quality_gate, smoke
from batch_worker.errors import BadInputError
from batch_worker.stats import limit_malloc_arenas

EPILOG = f"""exit codes:
  {int(ExitCode.OK):<3} shard complete (also when it was already complete under the same fingerprint)
  {int(ExitCode.FAILURE):<3} anything else (unexpected error): the orchestrator retries
  {int(ExitCode.BAD_INPUT):<3} bad config or input that no retry can fix; the message names the field/column
  {int(ExitCode.INTERRUPTED):<3} interrupted by SIGTERM/SIGINT after committing finished chunks: retry me
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (``run`` subcommand)."""
    parser = argparse.ArgumentParser(
        prog="batch-worker",
        description="Run one shard of a batch inference run to completion (all config comes from the manifest).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser(
        "run", help="run one shard", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Read the shard's rows, skip those already committed, infer, commit chunks, write the marker.",
    )
    run.add_argument("--run-dir", required=True, help="<output_root>/runs/<run_id> (local path, file:// or gs://)")
    run.add_argument("--shard", required=True, help="five-digit shard id, e.g. 00007")
    run.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    canary = sub.add_parser(
        "canary", help="run the pre-flight canary of a planned run",
        description="Run a sample of the run (the first rows of every shard) before the fan-out: search the "
                    "batch size, measure throughput, commit the rows into their shards, write canary.json.",
    )
    canary.add_argument("--run-dir", required=True, help="<output_root>/runs/<run_id>")
    canary.add_argument("--fraction", type=float, default=0.005, help="share of the rows to sample (default 0.005)")
    canary.add_argument("--min-rows", type=int, default=200, help="at least this many rows (default 200)")
    canary.add_argument("--max-rows", type=int, default=20_000, help="at most this many rows (default 20000)")
    canary.add_argument("--max-seconds", type=float, default=120.0,
                        help="start no new slice after this many seconds of work (default 120)")
    canary.add_argument("--search", default="auto", choices=("auto", "grow", "candidates"),
                        help="batch-size search: auto (grow on a GPU, candidates on CPU)")
    canary.add_argument("--grow-start", type=int, default=None,
                        help="first value of the grow search (default: the engine's: 16384 tokens for the "
                             "encoder, 128 sequences (max_num_seqs) for the LLM engine)")
    canary.add_argument("--candidates", type=lambda v: tuple(int(x) for x in v.split(",")), default=None,
                        help="comma-separated values the candidates search tries (default: the engine's: "
                             "2048,4096,8192,16384 tokens for the encoder, 8,16,32,64 sequences for the LLM engine)")
    canary.add_argument("--no-profile", action="store_true", help="ignore a saved tuning profile: search again")
    canary.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    quality_gate.add_parser(sub)  # ``quality-gate``: compare two LLM configs on a sample (quality_gate.py)
    smoke.add_parser(sub)  # ``smoke``: a new deployment's GPU and storage, from inside a pod (smoke.py)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns (and as a console script exits with) an ``ExitCode`` value."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    log = logging.getLogger("batch_worker")
    if args.command == "quality-gate":
        return quality_gate.cli_main(args)
    if args.command == "smoke":
        return smoke.cli_main(args)
    limit_malloc_arenas()  # before torch starts its threads
    from batch_worker.runtime import run_shard  # after logging is set up

    try:
        if args.command == "canary":
            return _canary(args)
        return run_shard(args.run_dir, args.shard)
    except (ConfigError, BadInputError) as exc:
        log.error("bad config or input (exit %d): %s", int(ExitCode.BAD_INPUT), exc)
        return int(ExitCode.BAD_INPUT)
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)
    except Exception:
        log.exception("%s failed (exit %d)", f"shard {getattr(args, 'shard', '')}".strip()
                      if args.command == "run" else "canary", int(ExitCode.FAILURE))
        return int(ExitCode.FAILURE)


def entry(argv: list[str] | None = None) -> NoReturn:
    """``python -m batch_worker`` and the ``batch-worker`` console script: :func:`main`, then flush the
    logs and standard streams and leave with ``os._exit`` (no interpreter finalization).

    Everything a command writes (parts, dead letters, attempt records, markers, progress) is committed
    synchronously before :func:`main` returns, so nothing is left for finalization to do but tear down
    modules: with torch imported that took 5.2 s here (a bare ``import torch`` process, 2-core machine at
    load average 9; 0.4 s for the worker's modules without torch), and a pod or subprocess that ends later
    is a slot, on a GPU node a GPU, held for nothing, and the mapped task ends that much later. The exit
    code is :func:`main`'s (an ``ExitCode`` value); ``SystemExit`` from argument parsing exits as usual.
    """
    code = main(argv)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be written anyway
            pass
    os._exit(code)


def _canary(args: argparse.Namespace) -> int:
    """``batch-worker canary``: run :func:`batch_worker.canary.run_canary`; exit 0 when it wrote canary.json."""
    from batch_worker.canary import CanaryOptions, run_canary

    try:
        options = CanaryOptions(fraction=args.fraction, min_rows=args.min_rows, max_rows=args.max_rows,
                                max_seconds=args.max_seconds, strategy=args.search, use_profile=not args.no_profile,
                                grow_start=args.grow_start, candidates=args.candidates)
    except ValueError as exc:
        raise ConfigError(f"canary: {exc}") from None
    run_canary(args.run_dir, options)
    return int(ExitCode.OK)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
