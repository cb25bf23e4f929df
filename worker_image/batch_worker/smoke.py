"""``batch-worker smoke``: what a first deployment must have, checked from inside a worker pod.

Run by the ``batch_inference_smoke`` DAG as one pod with the shard pods' spec (image, GPU spot pool
placement, service account): it reports, in one message, everything that is missing instead of the
first thing, so a platform engineer fixes a new cluster in one round:

* **GPU**: ``nvidia-smi`` is on ``PATH`` and lists a GPU (the driver and device plugin reached the pod),
  and ``torch.cuda.is_available()`` (the image's torch sees it);
* **storage**: a probe object is committed create-only under ``<output_root>/_smoke/`` (the pod's
  identity may create objects there), read back byte for byte, and a second create-only write of other
  bytes to the same name is refused (the create-only guarantee every marker relies on holds there).

Exit 0 when every check passed, 1 otherwise; the last stdout line is one JSON object with each check.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

NVIDIA_SMI_TIMEOUT_S = 30.0
"""``nvidia-smi`` answers in about a second on a healthy node; a hung driver does not answer at all."""


@dataclass
class SmokeReport:
    """The checks' outcomes: ``checks`` (name -> what was seen) and ``missing`` (one line per failed check)."""

    checks: dict[str, Any] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing

    def message(self) -> str:
        """One line: ``SMOKE OK ...`` or ``SMOKE FAILED: <every missing thing>``."""
        if self.ok:
            return "SMOKE OK: " + "; ".join(f"{k}={v}" for k, v in self.checks.items())
        return "SMOKE FAILED: " + "; ".join(self.missing)


def check_gpu(report: SmokeReport) -> None:
    """``nvidia-smi`` lists a GPU, and torch sees CUDA (adds to ``report``)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        report.missing.append("nvidia-smi is not on PATH: the pod has no NVIDIA driver mounted (is it on the GPU "
                              "node pool, with an nvidia.com/gpu limit?)")
    else:
        try:
            out = subprocess.run([smi, "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S)
            gpus = [line.strip() for line in out.stdout.splitlines() if line.strip()]
            report.checks["nvidia_smi"] = gpus
            if out.returncode != 0 or not gpus:
                report.missing.append(f"nvidia-smi exited {out.returncode} listing no GPU: {out.stderr.strip()[:300]}")
        except subprocess.TimeoutExpired:
            report.missing.append(f"nvidia-smi did not answer in {NVIDIA_SMI_TIMEOUT_S:.0f} s (driver hung?)")
    try:
        import torch

        available = bool(torch.cuda.is_available())
        report.checks["torch_cuda"] = available
        if available:
            report.checks["torch_device"] = torch.cuda.get_device_name(0)
        else:
            report.missing.append(f"torch.cuda.is_available() is False (torch {torch.__version__}, CUDA build "
                                  f"{torch.version.cuda}): the image's torch cannot use the GPU")
    except ImportError as exc:
        report.missing.append(f"torch does not import: {exc}")


def check_storage(report: SmokeReport, output_root: str) -> None:
    """Create-only commit, read back, and a refused overwrite under ``<output_root>/_smoke/``."""
    from batch_contract import storage
    from batch_contract.layout import join_uri
    from batch_contract.storage.base import AlreadyExistsError

    if "://" in output_root and not output_root.split("://", 1)[1].strip("/"):
        report.missing.append(f"output root {output_root!r} names no bucket")
        return
    uri = join_uri(output_root, "_smoke", f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}.json")
    payload = json.dumps({"host": os.uname().nodename, "pid": os.getpid()}).encode()
    try:
        storage.write_create_only(uri, payload)
    except Exception as exc:  # noqa: BLE001 - reported as what is missing
        report.missing.append(f"cannot create {uri}: {type(exc).__name__}: {exc}")
        return
    report.checks["probe"] = uri
    try:
        if storage.read_bytes(uri) != payload:
            report.missing.append(f"{uri} read back different bytes")
    except Exception as exc:  # noqa: BLE001
        report.missing.append(f"cannot read back {uri}: {type(exc).__name__}: {exc}")
    try:
        storage.write_create_only(uri, payload + b" ")
        report.missing.append(f"{uri} was overwritten: create-only writes are not enforced there")
    except AlreadyExistsError:
        report.checks["create_only"] = True
    except Exception as exc:  # noqa: BLE001
        report.missing.append(f"the overwrite check on {uri} failed: {type(exc).__name__}: {exc}")


def run_smoke(output_root: str, require_gpu: bool = True) -> SmokeReport:
    """All checks (GPU ones only when ``require_gpu``); never raises for a failed check."""
    report = SmokeReport()
    if require_gpu:
        check_gpu(report)
    check_storage(report, output_root)
    return report


def boolean(value: str) -> bool:
    """``true``/``false`` (any case; also ``1``/``0``, ``yes``/``no``), as a DAG renders a boolean Param."""
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError(f"not a boolean: {value!r} (true/false, 1/0, yes/no)")


def add_parser(sub: Any) -> None:
    """The ``smoke`` subcommand of ``batch-worker``."""
    smoke = sub.add_parser("smoke", help="check a new deployment from inside a worker pod (GPU, storage)",
                           description=__doc__.split("\n\n", 1)[0])
    smoke.add_argument("--output-root", required=True, help="where runs write (gs://bucket/prefix or a path)")
    smoke.add_argument("--gpu", type=boolean, default=True,
                       help="check the GPU: true (default) or false (a CPU-only pool: only the storage checks)")
    smoke.add_argument("--log-level", default="INFO", help="logging level (default INFO)")


def cli_main(args: Any) -> int:
    """Run the checks, print the one-line message (stderr) and the JSON object (stdout, last line)."""
    report = run_smoke(args.output_root, require_gpu=args.gpu)
    print(report.message(), file=sys.stderr)
    print(json.dumps({"ok": report.ok, **asdict(report)}, default=str))
    return 0 if report.ok else 1
