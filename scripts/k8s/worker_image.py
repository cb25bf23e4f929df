"""The worker image (``worker_image/Dockerfile``) built without a Docker engine and imported into containerd.

What it does, in order (each step skipped when its result already exists):

1. **Base.** With ``WORKER_IMAGE_BASE=debian`` (the default when the CUDA base is not in buildah's
   storage): a Debian bookworm root filesystem made from Debian packages by
   ``mmdebstrap --variant=minbase`` with the interpreter, ``tini`` and ``python3.11-venv`` already in it
   (so the Dockerfile's apt steps are skipped), saved as a tar in the cache and imported into buildah's
   storage (``buildah from scratch`` + ``add`` + ``commit``) as ``localhost/batch-worker-base:<hash>``.
   With ``WORKER_IMAGE_BASE=cuda``: the Dockerfile's default ``BASE_IMAGE`` and build arguments unchanged.
2. **Build.** ``buildah build --isolation chroot --network host --layers`` of ``worker_image/Dockerfile``
   from the repository root (``make worker-image`` uses ``docker build`` instead when a Docker engine
   answers; this module is the daemonless path). The Debian image gets
   CPU torch from this machine's pip sources: pip's ``find-links`` / ``index-url`` / ``extra-index-url`` /
   ``cert`` settings become ``PIP_*`` build arguments, and their local directories are bind-mounted
   read-only at the same paths (``-v``), so no CUDA torch is resolved. No vLLM (``WORKER_EXTRAS=""``),
   no gcc / tesseract (``SYSTEM_PACKAGES=""``).
3. **Cache.** The image is tagged ``localhost/batch-worker:<inputs>``, where ``<inputs>`` is a sha256 over
   the Dockerfile, every file it copies from the build context (:data:`COPIED`), the build arguments that
   shape the image and the base's identity (the base tar's sha256, or the ``BASE_IMAGE`` reference); the
   same hash is the label ``io.batch-inference.inputs``. An image with that tag is reused: no build. The
   OCI labels ``revision`` / ``created`` are those of the build that first made the image.
4. **Import.** ``buildah push <tag> oci-archive:<cache>/batch-worker-<inputs>.oci.tar`` (zstd layers, kept
   in the cache; a new build removes the older tags and archives), then
   ``ctr --address <socket> -n <namespace> images import``; the manifest digest containerd reports is
   returned. A pod references the image as ``localhost/batch-worker@sha256:<digest>``.

Cache directory: ``$BATCH_K8S_CACHE`` or ``~/.cache/airflow-batch-inference/k8s`` (the rule of
``scripts/k8s/cluster.py``), subfolder ``worker-image``. Needs root (buildah's chroot isolation,
mmdebstrap) and the Debian packages ``buildah``, ``mmdebstrap`` and ``containerd`` (for ``ctr``).

From Python (the live cluster)::

    from scripts.k8s.worker_image import ensure_image
    ref = ensure_image("/run/containerd/containerd.sock")   # ImageRef(name=..., digest="sha256:...")
    pod_image = ref.pinned                                    # "localhost/batch-worker@sha256:..."

CLI (``make worker-image``)::

    python -m scripts.k8s.worker_image build                       # build (or reuse); prints the tag
    python -m scripts.k8s.worker_image import --address SOCKET     # build if needed, import; prints JSON
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "worker_image" / "Dockerfile"
IMAGE_REPO = "localhost/batch-worker"
BASE_REPO = "localhost/batch-worker-base"
INPUTS_LABEL = "io.batch-inference.inputs"

DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_PACKAGES = ("python3.11", "python3.11-venv", "ca-certificates", "tini")
"""What the Dockerfile's base and builder stages install with ``PYTHON=python3.11``, ``SYSTEM_PACKAGES=""``
(``util-linux`` is in minbase), so that those apt steps find everything present and are skipped."""
DEBIAN_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*")
DEBIAN_SOURCE_DATE_EPOCH = "1735689600"
"""Timestamps of the made root filesystem (2025-01-01), so that the same packages give the same tar."""

DEBIAN_TORCH = "2.13.0+cpu"
"""The CPU torch of this machine's pip sources (``find-links``); the local version label keeps pip away
from a CUDA build of the same version on an index."""
DEBIAN_BUILD_ARGS = {
    "PYTHON": "python3.11",
    "SYSTEM_PACKAGES": "",
    "TORCH_VERSION": DEBIAN_TORCH,
    "VLLM_VERSION": "",
    "WORKER_EXTRAS": "",
}
"""Build arguments of the Debian test image (the Dockerfile's defaults are production's)."""

PIP_SETTINGS = {"index-url": "PIP_INDEX_URL", "extra-index-url": "PIP_EXTRA_INDEX_URL",
                "find-links": "PIP_FIND_LINKS", "cert": "PIP_CERT"}
"""pip configuration keys passed to the build, by the build argument the Dockerfile declares for each."""


class ImageBuildError(RuntimeError):
    """A step of building or importing the image failed; the message holds the command and its output."""


@dataclass(frozen=True)
class ImageRef:
    """The worker image as containerd holds it.

    Attributes:
        name: the reference it was imported under (``localhost/batch-worker:<inputs hash, 16 hex>``).
        digest: the manifest digest containerd reports (``sha256:<64 hex>``).
    """

    name: str
    digest: str

    @property
    def pinned(self) -> str:
        """``localhost/batch-worker@sha256:...``: what a pod's ``image`` names."""
        return f"{self.name.rsplit(':', 1)[0]}@{self.digest}"


def cache_dir() -> Path:
    """``$BATCH_K8S_CACHE/worker-image`` (default ``~/.cache/airflow-batch-inference/k8s/worker-image``)."""
    root = os.environ.get("BATCH_K8S_CACHE") or Path.home() / ".cache" / "airflow-batch-inference" / "k8s"
    return Path(root) / "worker-image"


def _run(cmd: list[str], *, log: bool = False, **kwargs) -> subprocess.CompletedProcess[str]:
    """Run ``cmd``; raise :class:`ImageBuildError` with its output on a non-zero exit. ``log``: stream the
    output to stderr instead of capturing it (long builds)."""
    if log:
        print(f"+ {shlex.join(cmd)}", file=sys.stderr, flush=True)
        result = subprocess.run(cmd, text=True, stdout=sys.stderr, stderr=sys.stderr, **kwargs)
        if result.returncode:
            raise ImageBuildError(f"{shlex.join(cmd)} exited {result.returncode} (output above)")
        return result
    result = subprocess.run(cmd, text=True, capture_output=True, **kwargs)
    if result.returncode:
        raise ImageBuildError(f"{shlex.join(cmd)} exited {result.returncode}: {result.stderr[-3000:]}")
    return result


def _buildah_has_image(ref: str) -> bool:
    return subprocess.run(["buildah", "inspect", "--type", "image", ref], capture_output=True).returncode == 0


def _dockerfile_default(name: str) -> str:
    """Default of a global ``ARG name=value`` of the Dockerfile."""
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith(f"ARG {name}="):
            return line.split("=", 1)[1].strip('"')
    raise ImageBuildError(f"{DOCKERFILE} has no global ARG {name}")


def default_base() -> str:
    """``$WORKER_IMAGE_BASE`` (``debian`` or ``cuda``); else ``cuda`` when the Dockerfile's CUDA base is in
    buildah's storage (no registry is needed then), ``debian`` otherwise."""
    chosen = os.environ.get("WORKER_IMAGE_BASE", "")
    if chosen:
        if chosen not in ("debian", "cuda"):
            raise ImageBuildError(f"WORKER_IMAGE_BASE={chosen!r}: use 'debian' or 'cuda'")
        return chosen
    if shutil.which("buildah") and _buildah_has_image(_dockerfile_default("BASE_IMAGE")):
        return "cuda"
    return "debian"


# --------------------------------------------------------------------------- the Debian base


def _debian_key() -> str:
    text = json.dumps([DEBIAN_SUITE, DEBIAN_PACKAGES, DEBIAN_EXCLUDES, DEBIAN_SOURCE_DATE_EPOCH])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def ensure_debian_base() -> tuple[str, str]:
    """The Debian base image in buildah's storage, made when missing.

    Returns:
        ``(image reference, sha256 of the root filesystem tar)``: the reference for ``BASE_IMAGE``, the
        sha256 for the build's input hash.

    Raises:
        ImageBuildError: mmdebstrap or buildah failed.
    """
    key = _debian_key()
    out = cache_dir()
    out.mkdir(parents=True, exist_ok=True)
    tar = out / f"debian-{DEBIAN_SUITE}-{key}.tar"
    ref = f"{BASE_REPO}:{DEBIAN_SUITE}-{key}"
    if not tar.exists():
        partial = tar.with_suffix(".partial.tar")
        cmd = ["mmdebstrap", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}",
               *[f"--dpkgopt=path-exclude={p}" for p in DEBIAN_EXCLUDES],
               "--dpkgopt=path-include=/usr/share/doc/*/copyright",
               "--aptopt=Acquire::Check-Valid-Until \"false\"",
               DEBIAN_SUITE, str(partial), DEBIAN_MIRROR]
        _run(cmd, log=True, env={**os.environ, "SOURCE_DATE_EPOCH": DEBIAN_SOURCE_DATE_EPOCH})
        (tar.parent / f"{tar.name}.sha256").write_text(_sha256_file(partial))
        partial.rename(tar)
    sums = tar.parent / f"{tar.name}.sha256"
    if not sums.exists():
        sums.write_text(_sha256_file(tar))
    digest = sums.read_text().strip()
    if not _buildah_has_image(ref):
        container = _run(["buildah", "from", "scratch"]).stdout.strip()
        try:
            _run(["buildah", "add", container, str(tar), "/"])
            _run(["buildah", "config", "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                  "--label", f"io.batch-inference.rootfs-sha256={digest}", "--cmd", "/bin/bash", container])
            _run(["buildah", "commit", "--quiet", container, ref])
        finally:
            subprocess.run(["buildah", "rm", container], capture_output=True)
    return ref, digest


# --------------------------------------------------------------------------- inputs and pip sources


COPIED = ("worker_image/pyproject.toml", "worker_image/entrypoint.sh", "plugins/batch_contract",
          "worker_image/batch_worker")
"""What the Dockerfile copies from the build context (tests/unit/test_worker_image_inputs.py checks that
these are its ``COPY`` sources)."""
SKIPPED = ("__pycache__", ".pytest_cache", ".ruff_cache")
"""Directories the ``.dockerignore`` keeps out of the context (with ``*.pyc`` and ``*.egg-info``)."""


def _context_files() -> list[Path]:
    """Files of the build context that the image is made from (:data:`COPIED`), sorted."""
    files = []
    for rel in COPIED:
        top = REPO / rel
        for path in ([top] if top.is_file() else sorted(top.rglob("*"))):
            parts = path.relative_to(REPO).parts
            if (path.is_file() and not path.name.endswith(".pyc")
                    and not any(part in SKIPPED or part.endswith(".egg-info") for part in parts)):
                files.append(path)
    return files


def inputs_hash(build_args: dict[str, str], base_identity: str) -> str:
    """sha256 over the Dockerfile, the context's files (path and bytes), ``build_args`` and the base.

    Args:
        build_args: the arguments that shape the image (not ``REVISION`` / ``CREATED`` / ``VERSION``).
        base_identity: the base tar's sha256 or the ``BASE_IMAGE`` reference.
    """
    h = hashlib.sha256()
    h.update(b"dockerfile\0" + DOCKERFILE.read_bytes())
    for path in _context_files():
        h.update(f"file\0{path.relative_to(REPO)}\0".encode() + path.read_bytes())
    h.update(json.dumps(sorted(build_args.items())).encode())
    h.update(f"base\0{base_identity}".encode())
    return h.hexdigest()


def pip_sources() -> tuple[dict[str, str], list[str]]:
    """This machine's pip sources as build arguments, and the local directories/files they name.

    Reads ``pip config list`` of the running interpreter (files and ``PIP_*`` environment). A ``file://``
    index URL names the directory above its ``simple/`` (the pages link to ``../../files/``).

    Returns:
        ``({"PIP_FIND_LINKS": ..., ...}, [local paths to bind-mount read-only])``.
    """
    result = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    values: dict[str, str] = {}
    for line in result.stdout.splitlines():
        key, _, raw = line.partition("=")
        name = key.split(".", 1)[-1]
        if name in PIP_SETTINGS:
            values[PIP_SETTINGS[name]] = raw.strip().strip("'\"")  # :env: lines come last and win
    mounts: list[str] = []
    for value in values.values():
        for token in value.split():
            path = urlparse(token).path if token.startswith("file://") else token
            if not path.startswith("/") or not os.path.exists(path):
                continue
            if token.startswith("file://") and Path(path).name == "simple":
                path = str(Path(path).parent)
            if path not in mounts:
                mounts.append(path)
    return values, mounts


# --------------------------------------------------------------------------- build and import


def _git(*args: str) -> str:
    result = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else "unknown"


def build(base: str | None = None) -> str:
    """Build the worker image unless one of the same inputs exists; return its tag.

    Args:
        base: ``debian`` or ``cuda`` (default: :func:`default_base`).

    Raises:
        ImageBuildError: a build step failed.
    """
    base = base or default_base()
    if base == "debian":
        base_ref, base_identity = ensure_debian_base()
        shaping = {**DEBIAN_BUILD_ARGS, "BASE_IMAGE": base_ref}
    else:
        base_identity = _dockerfile_default("BASE_IMAGE")
        shaping = {}
    inputs = inputs_hash(shaping, base_identity)
    tag = f"{IMAGE_REPO}:{inputs[:16]}"
    if _buildah_has_image(tag):
        return tag
    args = {**shaping, "REVISION": _git("rev-parse", "HEAD"), "VERSION": _git("describe", "--always", "--dirty"),
            "CREATED": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    pip_args, mounts = pip_sources() if base == "debian" else ({}, [])
    args.update(pip_args)
    flags = [f for k, v in sorted(args.items()) for f in ("--build-arg", f"{k}={v}")]
    flags += ["--label", f"{INPUTS_LABEL}={inputs}", "-f", str(DOCKERFILE), "-t", tag]
    volumes = [f for m in mounts for f in ("-v", f"{m}:{m}:ro")]
    _run(["buildah", "build", "--isolation", "chroot", "--network", "host", "--layers", *volumes, *flags,
          str(REPO)], log=True)
    _prune(tag)
    return tag


PRUNE_AFTER_SECONDS = 24 * 3600
"""Other ``localhost/batch-worker:*`` tags older than this (seconds since they were built) are removed at a
build. Younger ones stay: another checkout on the same machine (a CI clone beside a working tree) may be
about to export or run its own tag, and buildah's storage is machine-wide."""


def _prune(keep: str) -> None:
    """Remove the other ``localhost/batch-worker:*`` tags built more than :data:`PRUNE_AFTER_SECONDS` ago
    and their archives (each holds ~2 GB of layers); images already imported into a containerd stay there."""
    listing = _run(["buildah", "images", "--format", "{{.Name}}:{{.Tag}} {{.Created}}", "--noheading"]).stdout
    now = time.time()
    for line in listing.splitlines():
        name, _, created = line.partition(" ")
        if not name.startswith(f"{IMAGE_REPO}:") or name == keep:
            continue
        try:
            age = now - float(created)
        except ValueError:  # a format this buildah does not give: keep the image
            continue
        if age > PRUNE_AFTER_SECONDS:
            subprocess.run(["buildah", "rmi", name], capture_output=True)
            (cache_dir() / f"batch-worker-{name.rsplit(':', 1)[1]}.oci.tar").unlink(missing_ok=True)


def _archive(tag: str) -> Path:
    """The image as an OCI archive in the cache, written once per tag; every later import (a new
    containerd) reuses it. zstd layers (containerd >= 1.5 unpacks them): gzip of the ~2 GB took about
    2 minutes on 2 cores (buildah 1.28 ignores ``--disable-compression`` for ``oci-archive:``)."""
    path = cache_dir() / f"batch-worker-{tag.rsplit(':', 1)[1]}.oci.tar"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            partial = Path(tmp) / path.name
            _run(["buildah", "push", "--quiet", "--compression-format", "zstd", tag, f"oci-archive:{partial}:{tag}"])
            partial.rename(path)
    return path


def _containerd_digest(ctr: list[str], name: str) -> str | None:
    listing = _run([*ctr, "images", "ls", f"name=={name}"]).stdout.splitlines()
    for line in listing[1:]:
        fields = line.split()
        if fields and fields[0] == name:
            return fields[2]
    return None


def import_image(tag: str, containerd_address: str, namespace: str = "k8s.io") -> ImageRef:
    """Import the built image ``tag`` into the containerd at ``containerd_address`` (no-op when there).

    Returns:
        the reference and the manifest digest containerd reports.

    Raises:
        ImageBuildError: ``ctr`` failed, or containerd does not list the image after the import.
    """
    ctr = ["ctr", "--address", containerd_address, "--namespace", namespace]
    digest = _containerd_digest(ctr, tag)
    if digest is None:
        _run([*ctr, "images", "import", str(_archive(tag))])
        digest = _containerd_digest(ctr, tag)
    if digest is None:
        raise ImageBuildError(f"containerd at {containerd_address} does not list {tag} after the import")
    return ImageRef(name=tag, digest=digest)


def ensure_image(containerd_address: str, namespace: str = "k8s.io", base: str | None = None) -> ImageRef:
    """Build the worker image if needed and import it into a running containerd.

    Args:
        containerd_address: containerd's socket (``/run/containerd/containerd.sock`` or a test's own).
        namespace: containerd namespace (``k8s.io`` is the one the CRI plugin, i.e. the kubelet, uses).
        base: ``debian`` or ``cuda`` (default: :func:`default_base`).

    Returns:
        :class:`ImageRef`; a pod's image is :attr:`ImageRef.pinned` (``localhost/batch-worker@sha256:...``).

    Raises:
        ImageBuildError: a build or import step failed (the message holds the command and its output).
    """
    return import_image(build(base), containerd_address, namespace)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.k8s.worker_image", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_build = sub.add_parser("build", help="build (or reuse) the image; print its tag")
    p_import = sub.add_parser("import", help="build if needed, import into containerd; print JSON")
    for p in (p_build, p_import):
        p.add_argument("--base", choices=("debian", "cuda"), default=None,
                       help="base image (default: $WORKER_IMAGE_BASE, else cuda if its base is in "
                            "buildah's storage, else debian)")
    p_import.add_argument("--address", required=True, help="containerd socket")
    p_import.add_argument("--namespace", default="k8s.io")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(build(args.base))
        else:
            ref = ensure_image(args.address, args.namespace, args.base)
            print(json.dumps({"name": ref.name, "digest": ref.digest, "image": ref.pinned}))
    except ImageBuildError as exc:
        print(f"worker-image: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
