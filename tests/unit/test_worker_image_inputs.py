"""What decides whether ``scripts/k8s/worker_image.py`` rebuilds the worker image: the inputs hash covers
every file the Dockerfile copies, the Dockerfile, the build arguments and the base, and nothing else."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from scripts.k8s import worker_image

REPO = Path(__file__).resolve().parents[2]


def _copy_sources() -> list[str]:
    """``COPY`` sources from the build context in ``worker_image/Dockerfile`` (not ``--from=`` stages)."""
    text = (REPO / "worker_image" / "Dockerfile").read_text()
    sources = []
    for line in text.splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            parts = [p for p in line.split()[1:] if not p.startswith("--")]
            sources += parts[:-1]
    return sources


def test_the_hashed_files_are_what_the_dockerfile_copies() -> None:
    assert set(_copy_sources()) == set(worker_image.COPIED)


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the files the image is made from, with ``worker_image`` pointed at it."""
    for rel in (*worker_image.COPIED, "worker_image/Dockerfile"):
        src, dst = REPO / rel, tmp_path / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(src, dst)
    monkeypatch.setattr(worker_image, "REPO", tmp_path)
    monkeypatch.setattr(worker_image, "DOCKERFILE", tmp_path / "worker_image" / "Dockerfile")
    return tmp_path


def test_inputs_hash_changes_with_each_input_and_only_with_them(tree: Path) -> None:
    args = dict(worker_image.DEBIAN_BUILD_ARGS)
    first = worker_image.inputs_hash(args, "base-a")
    assert worker_image.inputs_hash(dict(args), "base-a") == first

    (tree / "worker_image" / "batch_worker" / "__pycache__").mkdir(exist_ok=True)
    (tree / "worker_image" / "batch_worker" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"x")
    (tree / "plugins" / "batch_inference").mkdir(parents=True)
    (tree / "plugins" / "batch_inference" / "pod_spec.py").write_text("# not in the image\n")
    assert worker_image.inputs_hash(args, "base-a") == first, "files outside the image changed the hash"

    assert worker_image.inputs_hash(args, "base-b") != first
    assert worker_image.inputs_hash({**args, "TORCH_VERSION": "2.14.0"}, "base-a") != first
    cli = tree / "worker_image" / "batch_worker" / "cli.py"
    cli.write_text(cli.read_text() + "\n")
    second = worker_image.inputs_hash(args, "base-a")
    assert second != first
    contract = next((tree / "plugins" / "batch_contract").glob("*.py"))
    contract.write_text(contract.read_text() + "\n")
    assert worker_image.inputs_hash(args, "base-a") != second


def test_image_ref_pins_the_repository_by_digest() -> None:
    ref = worker_image.ImageRef(name="localhost/batch-worker:0123456789abcdef", digest="sha256:" + "a" * 64)
    assert ref.pinned == "localhost/batch-worker@sha256:" + "a" * 64


def test_pip_sources_become_build_args_and_read_only_mounts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """The host's find-links / index settings reach the build, and their local directories are mounted
    (a ``file://`` index by the folder above ``simple/``, whose pages link to ``../../files/``)."""
    wheels, index = tmp_path / "wheels", tmp_path / "pypi"
    wheels.mkdir()
    (index / "simple").mkdir(parents=True)
    for name in [k for k in os.environ if k.startswith("PIP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no configuration file: the environment only
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", f"file://{index}/simple https://example.org/simple")
    args, mounts = worker_image.pip_sources()
    assert args["PIP_FIND_LINKS"] == str(wheels)
    assert args["PIP_EXTRA_INDEX_URL"] == f"file://{index}/simple https://example.org/simple"
    assert "PIP_INDEX_URL" not in args
    assert sorted(mounts) == sorted([str(wheels), str(index)])
