"""Operator CLI: ``python -m batch_inference.publish publish|rollback ...`` (prints one JSON object).

Examples::

    python -m batch_inference.publish publish --run-dir output/runs/manual__1 \\
        --backend duckdb --duckdb-path output/results.duckdb --table embeddings
    BATCH_PUBLISH_DSN=postgresql://user@host/db python -m batch_inference.publish rollback \\
        --backend postgres --schema analytics --table embeddings

Exit codes: 0 success, 1 publish refused or failed (coverage, markers, fingerprints, database),
2 invalid arguments (bad identifier, ratio out of range).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from batch_inference.publish.api import publish_run, rollback
from batch_inference.publish.errors import PublishError
from batch_inference.publish.target import BACKENDS, PublishTarget

DSN_ENV = "BATCH_PUBLISH_DSN"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m batch_inference.publish", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("publish", "rollback"):
        p = sub.add_parser(name)
        p.add_argument("--backend", choices=BACKENDS, default="duckdb")
        p.add_argument("--table", required=True)
        p.add_argument("--schema", default=None)
        p.add_argument("--duckdb-path", default=None, help="DuckDB database file (backend duckdb)")
        p.add_argument("--dsn", default=None, help=f"PostgreSQL DSN (backend postgres; the catalog database "
                       f"for backend iceberg, optional); default ${DSN_ENV}")
        p.add_argument("--iceberg-warehouse", default=None,
                       help="Iceberg warehouse directory (backend iceberg; SQLite catalog.db beside it)")
        if name == "publish":
            p.add_argument("--run-dir", required=True, help="<output_root>/runs/<run_id>")
            p.add_argument("--min-success-ratio", type=float, default=1.0)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code."""
    args = _parser().parse_args(argv)
    try:
        target = PublishTarget(
            backend=args.backend, table=args.table, schema=args.schema, duckdb_path=args.duckdb_path,
            dsn=args.dsn or os.environ.get(DSN_ENV), iceberg_warehouse=args.iceberg_warehouse,
        )
        if args.command == "publish":
            result = publish_run(args.run_dir, target, min_success_ratio=args.min_success_ratio)
        else:
            result = rollback(target)
    except PublishError as exc:
        print(f"publish: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"publish: invalid argument: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # database driver errors (psycopg.Error, duckdb.Error): one line, exit 1
        print(f"publish: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
