"""The small images a real node needs besides the worker image, written here as OCI archives.

No registry is reachable from the test machine, so the pod sandbox image (``pause``, compiled from the
kubernetes source tree's ``build/pause/linux/pause.c``) and the ``busybox`` image the cluster tests'
shell pods use are built from local files: one uncompressed layer, an image config and a manifest in
an OCI image-layout tar (https://github.com/opencontainers/image-spec/blob/v1.0.2/image-layout.md),
byte-stable for the same files (tar mtimes and owners are zero), imported into containerd with
``ctr images import``.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
BUSYBOX_IMAGE = "docker.io/library/busybox:1.35.0"
"""The shell image of the cluster tests (Debian's ``busybox-static`` 1.35.0); a versioned tag, so the
kubelet's default pull policy is ``IfNotPresent`` and the imported copy is used."""
PAUSE_IMAGE = "registry.k8s.io/pause:3.4.1-local"
"""The pod sandbox image containerd's CRI plugin is configured with (``sandbox_image``)."""


@dataclass(frozen=True)
class ImageFile:
    """One entry of an image's single layer: ``path`` inside the image (no leading ``/``), ``data`` the
    file's bytes (None for a directory or a symlink), ``mode`` its permission bits, ``link`` a symlink
    target."""

    path: str
    data: bytes | None = None
    mode: int = 0o755
    link: str = ""


def _layer(files: list[ImageFile]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for f in sorted(files, key=lambda f: f.path):
            info = tarfile.TarInfo(f.path)
            info.mode, info.mtime, info.uid, info.gid = f.mode, 0, 0, 0
            if f.link:
                info.type, info.linkname = tarfile.SYMTYPE, f.link
                tar.addfile(info)
            elif f.data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(f.data)
                tar.addfile(info, io.BytesIO(f.data))
    return buf.getvalue()


def _digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def write_oci_archive(out: Path, name: str, files: list[ImageFile], *, entrypoint: list[str],
                      cmd: list[str] | None = None, user: str = "") -> str:
    """Write a one-layer linux/amd64 image named ``name`` (``registry/repo:tag``) to ``out`` as an OCI
    image-layout tar; returns the manifest digest (``sha256:<64 hex>``), which is what a pod's
    ``image@sha256:`` reference and containerd's repo digest name.

    The archive is byte-stable for the same ``files`` and arguments (zero mtimes and owners).
    """
    layer = _layer(files)
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "Cmd": cmd or [], "User": user,
                   "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": _digest(config), "size": len(config)},
        "layers": [{"mediaType": OCI_LAYER, "digest": _digest(layer), "size": len(layer)}],
    }, sort_keys=True).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": OCI_MANIFEST, "digest": _digest(manifest), "size": len(manifest),
        "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]},
        "platform": {"architecture": "amd64", "os": "linux"}}]}, sort_keys=True).encode()
    blobs = {_digest(b).split(":", 1)[1]: b for b in (layer, config, manifest)}
    entries = [ImageFile("blobs", None), ImageFile("blobs/sha256", None),
               *(ImageFile(f"blobs/sha256/{h}", b, 0o644) for h, b in blobs.items()),
               ImageFile("oci-layout", b'{"imageLayoutVersion":"1.0.0"}', 0o644),
               ImageFile("index.json", index, 0o644)]
    tmp = out.with_suffix(".tmp")
    tmp.write_bytes(_layer(entries))
    tmp.replace(out)
    return _digest(manifest)


def pause_archive(pause_binary: Path, out: Path) -> str:
    """The sandbox image (:data:`PAUSE_IMAGE`): the static ``pause`` binary as ``/pause``, run as
    65535 like upstream's; returns its manifest digest."""
    return write_oci_archive(out, PAUSE_IMAGE, [ImageFile("pause", pause_binary.read_bytes())],
                             entrypoint=["/pause"], user="65535:65535")


def busybox_archive(busybox_binary: Path, out: Path) -> str:
    """The tests' shell image (:data:`BUSYBOX_IMAGE`): a static busybox as ``/bin/busybox`` with a link
    per applet it lists, an empty ``/tmp``; returns its manifest digest.

    Raises:
        subprocess.CalledProcessError: the binary cannot list its applets.
    """
    applets = subprocess.run([str(busybox_binary), "--list"], check=True, capture_output=True,
                             text=True).stdout.split()
    files = [ImageFile("bin", None), ImageFile("tmp", None, 0o1777),
             ImageFile("bin/busybox", busybox_binary.read_bytes())]
    files += [ImageFile(f"bin/{a}", link="busybox") for a in applets if a != "busybox"]
    return write_oci_archive(out, BUSYBOX_IMAGE, files, entrypoint=[], cmd=["sh"])


def ctr_import(archive: Path, address: str, namespace: str = "k8s.io") -> None:
    """Import ``archive`` into the containerd at ``address`` (its socket path), namespace ``namespace``
    (the CRI plugin's is ``k8s.io``).

    Raises:
        RuntimeError: ``ctr`` failed (its output in the message).
    """
    out = subprocess.run(["ctr", "-a", address, "-n", namespace, "images", "import", "--all-platforms",
                          str(archive)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"ctr images import {archive.name} failed: {out.stdout}{out.stderr}")
