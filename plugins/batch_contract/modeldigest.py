"""Model digest: a hash of the files that determine a model's outputs (weights, configs, tokenizer).

In the contract because both sides compute it: the worker for the result fingerprint, the plan task for
shard carry-over (:mod:`batch_contract.carryover`, when the model directory is readable there).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

DIGEST_SUFFIXES = (".safetensors", ".bin", ".pt", ".json", ".txt", ".model", ".tiktoken", ".py")
"""File name suffixes that count: weights, model/tokenizer/pooling configs, vocabularies, remote code.
README files and VCS metadata do not change outputs and are skipped."""

_CACHE: dict[tuple, str] = {}


def _model_files(model_dir: Path) -> list[Path]:
    files = [
        p
        for p in model_dir.rglob("*")
        if p.is_file()
        and p.suffix in DIGEST_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(model_dir).parts)
        and p.name.lower() != "readme.md"
    ]
    return sorted(files, key=lambda p: p.relative_to(model_dir).as_posix())


def model_digest(model_dir: str | Path) -> str:
    """SHA-256 (hex, 64 chars) over the relative names and contents of a model directory's files.

    Hashing all-MiniLM-L6-v2 (about 90 MB) takes a fraction of a second; the result is cached in-process,
    keyed by every file's (name, size, mtime_ns), so a second call is free and an edited file is seen.

    Args:
        model_dir: local model directory (transformers layout).

    Raises:
        FileNotFoundError: ``model_dir`` is not a directory or holds no model files.
    """
    root = Path(model_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"model directory {root} does not exist")
    files = _model_files(root)
    if not files:
        raise FileNotFoundError(f"model directory {root} holds no model files ({', '.join(DIGEST_SUFFIXES)})")
    key = tuple((p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    key = (str(root.resolve()), key)
    cached = _CACHE.get(key)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    for p in files:
        h.update(p.relative_to(root).as_posix().encode("utf-8") + b"\0")
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        h.update(b"\0")
    digest = h.hexdigest()
    _CACHE[key] = digest
    return digest
