"""The worker image built without a Docker engine, imported into containerd and run there by runc.

``scripts/k8s/worker_image.py`` builds ``worker_image/Dockerfile`` with buildah on a Debian base made by
mmdebstrap (cached by a hash of its inputs), and imports it into a containerd this module starts on its
own root, state and socket (CRI plugin disabled). Then ``ctr run`` (runc) runs the image's entrypoint
(read from the image, as a pod without ``command`` would) with a read-only root filesystem, writable
``/cache`` and ``/tmp`` only, and the run directory on a bind mount:

* a shard of real rows is encoded by MiniLM inside the container, as uid 10001, equal (cosine >= 0.9999)
  to the same shard encoded by the worker on this machine;
* SIGTERM sent by containerd to PID 1 (tini) during a run reaches the worker, which commits its finished
  chunks and exits 75, and the container's exit status is 75.

Runs in the live-cluster lane: skipped unless ``BATCH_WORKER_IMAGE_TESTS=1`` (the first build takes
minutes), and skipped when buildah, mmdebstrap, containerd, ctr or runc is missing or not running as root.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from batch_contract.marker import ShardMarker
from batch_worker.runtime import run_shard
from run_helpers import SAMPLE_PARQUET, write_run

from scripts.k8s import worker_image

TOOLS = ("buildah", "mmdebstrap", "containerd", "ctr", "runc")
MISSING = [t for t in TOOLS if shutil.which(t) is None]

pytestmark = [
    pytest.mark.integration,
    pytest.mark.k8s,
    pytest.mark.skipif(os.environ.get("BATCH_WORKER_IMAGE_TESTS") != "1",
                       reason="worker image tests run in the live-cluster lane (BATCH_WORKER_IMAGE_TESTS=1)"),
    pytest.mark.skipif(bool(MISSING), reason=f"not installed: {', '.join(MISSING)} (Debian packages)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="buildah's chroot isolation and containerd need root"),
]

NAMESPACE = "batch-image-test"
WORKER_UID = 10001
CONTAINERD_CONFIG = """version = 2
root = "{root}/root"
state = "{root}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "{root}/containerd.sock"
[ttrpc]
  address = "{root}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"
"""


@pytest.fixture(scope="module")
def containerd() -> Iterator[str]:
    """A containerd of this module's own (root, state, socket in a short temp dir); yields its socket."""
    root = Path(tempfile.mkdtemp(prefix="ctrd-"))  # a unix socket path must stay under 108 bytes
    config = root / "config.toml"
    config.write_text(CONTAINERD_CONFIG.format(root=root))
    log = (root / "containerd.log").open("w")
    proc = subprocess.Popen(["containerd", "--config", str(config)], stdout=log, stderr=subprocess.STDOUT)
    address = str(root / "containerd.sock")
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["ctr", "--address", address, "version"], capture_output=True).returncode:
            assert proc.poll() is None, (root / "containerd.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "containerd did not answer in 30 s"
            time.sleep(0.2)
        yield address
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        subprocess.run(["umount", "-R", str(root / "root")], capture_output=True)
        # The unpacked image is ~60k files: deleting them took 1m43s here, so it goes on after the test.
        subprocess.Popen(["rm", "-rf", str(root)], start_new_session=True, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def image(containerd: str) -> worker_image.ImageRef:
    return worker_image.ensure_image(containerd, namespace=NAMESPACE, base="debian")


@pytest.fixture(scope="module")
def entrypoint(image: worker_image.ImageRef) -> list[str]:
    """The image's ENTRYPOINT as built (what a pod that sets only ``args`` runs)."""
    out = subprocess.run(["buildah", "inspect", "--type", "image", image.name], capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out)["OCIv1"]["config"]["Entrypoint"]


def _writable_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, WORKER_UID, WORKER_UID)
    return path


def _run_in(data: Path, **kwargs) -> str:
    """A run of the sample's rows with input and output under ``data`` (the container sees only that),
    owned by the worker's uid; returns the run dir."""
    sample = _writable_dir(data / "in") / SAMPLE_PARQUET.name
    shutil.copy(SAMPLE_PARQUET, sample)
    run_dir = write_run(data / "out", sample, **kwargs)
    for path in data.rglob("*"):
        os.chown(path, WORKER_UID, WORKER_UID)
    return run_dir


def _ctr_run(containerd: str, image: worker_image.ImageRef, name: str, data: Path, command: list[str]
             ) -> subprocess.Popen[str]:
    """``ctr run --rm --read-only`` of the image: ``data`` bind-mounted at the same path, /cache a
    bind mount owned by the worker, /tmp a tmpfs. No network namespace of the host."""
    cache = _writable_dir(data.parent / f"{name}-cache")
    mounts = ["type=tmpfs,src=tmpfs,dst=/tmp,options=nosuid:nodev:mode=1777",  # first: data may lie under /tmp
              f"type=bind,src={data},dst={data},options=rbind:rw",
              f"type=bind,src={cache},dst=/cache,options=rbind:rw"]
    cmd = ["ctr", "--address", containerd, "--namespace", NAMESPACE, "run", "--rm", "--read-only",
           *[arg for m in mounts for arg in ("--mount", m)], image.name, name, *command]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _embeddings(shard: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for part in sorted(shard.glob("part-*.parquet")):
        table = pq.read_table(part)
        for rid, emb in zip(table.column("id").to_pylist(), table.column("embedding").to_pylist(), strict=True):
            assert rid not in out, f"id {rid} committed twice"
            out[rid] = np.asarray(emb, dtype=np.float32)
    return out


def test_image_is_pinned_by_the_digest_containerd_reports(image: worker_image.ImageRef, containerd: str) -> None:
    assert image.digest.startswith("sha256:") and len(image.digest) == 71, image
    assert image.pinned == f"{worker_image.IMAGE_REPO}@{image.digest}"
    listing = subprocess.run(["ctr", "--address", containerd, "--namespace", NAMESPACE, "images", "ls"],
                             capture_output=True, text=True, check=True).stdout
    assert f"{image.name} " in listing and image.digest in listing
    # Imported again: nothing rebuilt, the same digest.
    assert worker_image.ensure_image(containerd, namespace=NAMESPACE, base="debian") == image


def test_worker_encodes_a_shard_in_the_container_as_uid_10001(
        image: worker_image.ImageRef, containerd: str, entrypoint: list[str], tmp_path: Path) -> None:
    assert entrypoint == ["tini", "--", "batch-worker"]
    data = _writable_dir(tmp_path / "data")
    run_dir = _run_in(data, rows=96, worker={"chunk_rows": 32})
    proc = _ctr_run(containerd, image, "encode", data, [*entrypoint, "run", "--run-dir", run_dir, "--shard", "00000"])
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-4000:]
    shard = Path(run_dir) / "shards" / "00000"
    marker = ShardMarker.from_json_bytes((shard / "_SUCCESS.json").read_bytes())
    assert marker.rows_ok == 96, marker
    parts = sorted(shard.glob("part-*.parquet"))
    assert parts and all(p.stat().st_uid == WORKER_UID for p in parts), [(p, p.stat().st_uid) for p in parts]
    in_container = _embeddings(shard)

    reference_dir = write_run(tmp_path / "reference", SAMPLE_PARQUET, rows=96, worker={"chunk_rows": 32})
    assert run_shard(reference_dir, "00000", install_signals=False) == 0
    on_host = _embeddings(Path(reference_dir) / "shards" / "00000")
    assert in_container.keys() == on_host.keys() and len(on_host) == 96
    # Float32 batching noise only (measured: most rows bit for bit, worst cosine 0.99998).
    worst = min(float(in_container[rid] @ vec / (np.linalg.norm(in_container[rid]) * np.linalg.norm(vec)))
                for rid, vec in on_host.items())
    assert worst >= 0.9999, f"worst cosine {worst:.6f}"


def test_sigterm_to_the_container_reaches_the_worker_through_tini_and_exits_75(
        image: worker_image.ImageRef, containerd: str, entrypoint: list[str], tmp_path: Path) -> None:
    data = _writable_dir(tmp_path / "data")
    run_dir = _run_in(data, worker={"chunk_rows": 64})
    shard = Path(run_dir) / "shards" / "00000"
    proc = _ctr_run(containerd, image, "sigterm", data, [*entrypoint, "run", "--run-dir", run_dir, "--shard", "00000"])
    try:
        deadline = time.monotonic() + 300
        while not list(shard.glob("part-*.parquet")):
            assert proc.poll() is None, proc.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "no chunk committed in 300 s"
            time.sleep(0.2)
        subprocess.run(["ctr", "--address", containerd, "--namespace", NAMESPACE, "task", "kill", "--signal",
                        signal.SIGTERM.name, "sigterm"], check=True, capture_output=True)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            subprocess.run(["ctr", "--address", containerd, "--namespace", NAMESPACE, "task", "kill", "--signal",
                            "SIGKILL", "sigterm"], capture_output=True)
            proc.wait(timeout=60)
    assert proc.returncode == 75, output[-4000:]
    assert not (shard / "_SUCCESS.json").exists(), "an interrupted shard must not be marked complete"
    committed = _embeddings(shard)
    assert 0 < len(committed) < pq.read_metadata(SAMPLE_PARQUET).num_rows, len(committed)
