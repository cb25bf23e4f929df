"""``batch-worker`` command line (also ``python -m batch_worker``)."""

from __future__ import annotations

import argparse
import logging
import sys

from batch_contract.engine_config import ConfigError
from batch_contract.enums import ExitCode

from batch_worker import quality_gate
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
    quality_gate.add_parser(sub)  # ``quality-gate``: compare two LLM configs on a sample (quality_gate.py)
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
    limit_malloc_arenas()  # before torch starts its threads
    from batch_worker.runtime import run_shard  # after logging is set up

    try:
        return run_shard(args.run_dir, args.shard)
    except (ConfigError, BadInputError) as exc:
        log.error("bad config or input (exit %d): %s", int(ExitCode.BAD_INPUT), exc)
        return int(ExitCode.BAD_INPUT)
    except KeyboardInterrupt:
        return int(ExitCode.INTERRUPTED)
    except Exception:
        log.exception("shard %s failed (exit %d)", args.shard, int(ExitCode.FAILURE))
        return int(ExitCode.FAILURE)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
