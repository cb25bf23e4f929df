"""Operator CLI: ``python -m batch_inference.publish publish|rollback ...`` (prints one JSON object).

Examples::

    python -m batch_inference.publish publish --run-dir output/runs/manual__1 \\
        --backend duckdb --duckdb-path output/results.duckdb --table embeddings
    BATCH_PUBLISH_DSN=postgresql://user@host/db python -m batch_inference.publish rollback \\
        --backend postgres --schema analytics --table embeddings

The DSN (PostgreSQL, or the Iceberg catalog database) is read from the environment variable named by
``--dsn-env`` (default ``BATCH_PUBLISH_DSN``), never from the command line, where every user of the
machine could read it (``ps``, ``/proc/<pid>/cmdline``); ``--dsn`` is refused without echoing its value.

Exit codes: 0 success, 1 publish refused or failed (coverage, markers, fingerprints, a table publish did
not create, database), 2 invalid arguments (bad identifier, ratio out of range, ``--dsn``, an unset
``--dsn-env`` variable for backend postgres).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from batch_inference.publish.api import publish_run, rollback
from batch_inference.publish.errors import PublishError
from batch_inference.publish.redact import redact
from batch_inference.publish.registry import DEFAULT_BACKEND, backend_class
from batch_inference.publish.target import BACKENDS, DEFAULT_SCHEMA, PublishTarget

DSN_ENV = "BATCH_PUBLISH_DSN"
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose error messages pass through :func:`redact` (``unrecognized
    arguments: ...`` would echo a URI given by mistake)."""

    def error(self, message: str) -> NoReturn:
        super().error(redact(message, None))


class _RefuseDsn(argparse.Action):
    """``--dsn VALUE``: refused, and the value is not repeated."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        parser.error(f"--dsn is not accepted (a DSN on the command line is visible to every user of the "
                     f"machine); put it in ${DSN_ENV} or in the variable named by --dsn-env")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m batch_inference.publish", description=__doc__.split("\n")[0],
                     allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in ("publish", "rollback"):
        p = sub.add_parser(name, allow_abbrev=False)
        p.add_argument("--backend", choices=BACKENDS, default=DEFAULT_BACKEND)
        p.add_argument("--table", required=True)
        p.add_argument("--schema", default=DEFAULT_SCHEMA, help=f"schema / namespace (default {DEFAULT_SCHEMA})")
        p.add_argument("--duckdb-path", default=None, help="DuckDB database file (backend duckdb)")
        p.add_argument("--dsn-env", default=DSN_ENV, metavar="NAME",
                       help=f"environment variable holding the PostgreSQL DSN (backend postgres; the catalog "
                       f"database for backend iceberg, optional); default {DSN_ENV}")
        p.add_argument("--dsn", action=_RefuseDsn, help=argparse.SUPPRESS)
        p.add_argument("--iceberg-warehouse", default=None,
                       help="Iceberg warehouse directory (backend iceberg; SQLite catalog.db beside it)")
        if name == "publish":
            p.add_argument("--run-dir", required=True, help="<output_root>/runs/<run_id>")
            p.add_argument("--min-success-ratio", type=float, default=1.0)
    return parser


def _dsn(args: argparse.Namespace) -> str | None:
    """The DSN from the environment variable ``--dsn-env`` names (``None`` if unset or empty).

    Raises:
        ValueError: ``--dsn-env`` is not a variable name, or the backend needs a DSN (its class's
            ``dsn_required``: postgres) and the variable is unset.
    """
    if not ENV_NAME.fullmatch(args.dsn_env):
        raise ValueError("--dsn-env: not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
    dsn = os.environ.get(args.dsn_env) or None
    if dsn is None and backend_class(args.backend).dsn_required:
        raise ValueError(f"dsn: required for backend {args.backend}; set it in ${args.dsn_env} "
                         "(--dsn-env names the variable)")
    return dsn


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (argparse exits with 2 on unparsable arguments)."""
    args = _parser().parse_args(argv)
    dsn: str | None = None
    try:
        dsn = _dsn(args)
        target = PublishTarget(
            backend=args.backend, table=args.table, schema=args.schema, duckdb_path=args.duckdb_path,
            dsn=dsn, iceberg_warehouse=args.iceberg_warehouse,
        )
        if args.command == "publish":
            result = publish_run(args.run_dir, target, min_success_ratio=args.min_success_ratio)
        else:
            result = rollback(target)
    except PublishError as exc:
        print(f"publish: {redact(str(exc), dsn)}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"publish: invalid argument: {redact(str(exc), dsn)}", file=sys.stderr)
        return 2
    except Exception as exc:  # database driver errors (psycopg.Error, duckdb.Error): one line, exit 1
        print(f"publish: {type(exc).__name__}: {redact(str(exc), dsn)}", file=sys.stderr)
        return 1
    print(json.dumps(result, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
