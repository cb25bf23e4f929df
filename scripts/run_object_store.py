"""``make run-s3`` / ``make run-azure``: the main job with its input and output on an object store
emulated on this machine.

Starts the scheme's emulator on 127.0.0.1 (moto's S3 server for ``s3``, Azurite for ``az``,
fake-gcs-server for ``gs``; the tests' own wrappers in ``tests/``), creates a bucket (container), copies
the input to ``<scheme>://<bucket>/input/``, then runs ``batch_inference.cli run`` with the output on
``<scheme>://<bucket>/output`` (the local runner's worker subprocesses and the gate, publish and report
steps all reach the emulator through the environment the backend reads: ``AWS_ENDPOINT_URL`` and
credentials, or ``AZURE_STORAGE_CONNECTION_STRING``). The published table goes to the CLI's local
DuckDB file unless flags after ``--`` say otherwise. At the end the report is copied to
``<output>/<scheme>/<run id>/`` and its local path is printed LAST; the emulator is stopped, whatever
happened (it keeps its data in memory only).

Usage: ``python -m scripts.run_object_store --scheme s3 --input FILE --output DIR [--rows-per-shard N]
[-- CLI FLAGS]``. Exit code: the CLI's (0 on success).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO_ROOT / "plugins"), str(REPO_ROOT / "tests")]

import object_stores  # noqa: E402 - the tests' emulator wrappers
from batch_contract import storage  # noqa: E402


def _copy_report(report_uri: str, dest: Path) -> Path:
    """Copy ``report.json`` (and ``report.html`` when present) under ``dest``; returns the JSON's path."""
    dest.mkdir(parents=True, exist_ok=True)
    base = report_uri.rsplit("/", 1)[0]
    for name in ("report.json", "report.html"):
        if storage.exists(f"{base}/{name}"):
            (dest / name).write_bytes(storage.read_bytes(f"{base}/{name}"))
    return dest / "report.json"


def run(args: argparse.Namespace) -> int:
    """Start the emulator, copy the input, run the CLI, copy the report, stop. Returns the CLI's exit code."""
    with object_stores.started(args.scheme) as store:
        root = store.new_root("batch-inference")
        src = Path(args.input)
        input_uri = f"{root}/input/{src.name}"
        storage.write_create_only(input_uri, src.read_bytes())
        print(f"{args.scheme}: emulator {store.url}; input {input_uri}", flush=True)
        paths = [str(REPO_ROOT / "plugins"), str(REPO_ROOT / "worker_image"),
                 *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = {**os.environ, **store.env(), "PYTHONPATH": os.pathsep.join(paths)}
        cmd = [sys.executable, "-m", "batch_inference.cli", "run", "--input", input_uri,
               "--output", f"{root}/output",
               *(["--rows-per-shard", str(args.rows_per_shard)] if args.rows_per_shard else []), *args.cli_args]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, cwd=REPO_ROOT)
        lines = []
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            if line.strip():
                lines.append(line.strip())
        code = proc.wait()
        report_uri = lines[-1] if lines else ""
        if code != 0 or not report_uri.startswith(f"{args.scheme}://"):
            print(f"run-{args.scheme} failed (exit {code})", file=sys.stderr)
            return code or 1
        run_id = report_uri.rstrip("/").split("/")[-2]
        local = _copy_report(report_uri, Path(args.output) / args.scheme / run_id)
    print(local)
    return 0


def _terminated(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    """CLI entry (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="python -m scripts.run_object_store", description=__doc__.split("\n", 1)[0])
    ap.add_argument("--scheme", choices=object_stores.SCHEMES, required=True)
    ap.add_argument("--input", default=str(REPO_ROOT / "data" / "sample" / "debian_descriptions_sample.parquet"))
    ap.add_argument("--output", default=str(REPO_ROOT / "output"))
    ap.add_argument("--rows-per-shard", type=int, default=None, help="rows per shard (default: the Param's)")
    ap.add_argument("cli_args", nargs=argparse.REMAINDER, help="more batch_inference.cli run flags after --")
    args = ap.parse_args(argv)
    args.cli_args = [a for a in args.cli_args if a != "--"]
    signal.signal(signal.SIGTERM, _terminated)  # run the cleanup on `kill`, too
    try:
        return run(args)
    except KeyboardInterrupt:
        print(f"run-{args.scheme} interrupted; the emulator was stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
