#!/usr/bin/env bash
# Build the live-cluster parts the Kubernetes tests need, once, and cache them:
#   - kube-apiserver, kubelet, kube-scheduler and kube-controller-manager v1.20.2 from Debian bookworm's
#     `kubernetes` source package (the full upstream tree with vendor/), built with Debian's Go 1.19 in
#     one `make` (the code generators run once): about 25 CPU-minutes cold for the four;
#   - the pod sandbox's `pause` from the same tree (build/pause/linux/pause.c), compiled statically;
#   - from Debian: etcd (`etcd-server`), containerd, runc, the CNI plugins, a static busybox (the
#     tests' shell image) and tini (the pods' PID 1; the node agent runs it from the host).
#   - the worker image's builders from Debian: buildah and mmdebstrap (scripts/k8s/worker_image.py).
# Idempotent: cached binaries of the right version are reused (a second run builds nothing); only the
# missing ones are built. `--packages-only`: install the Debian packages and stop (so the image build
# can run beside the compile). Cache: $BATCH_K8S_CACHE (default ~/.cache/airflow-batch-inference/k8s).
# Needs apt (root or sudo). Facts behind this recipe: ../shared/notes/k8s-live-apiserver/README.md and
# ../shared/notes/real-node/README.md.
set -euo pipefail
VERSION=v1.20.2
SRC_VERSION=1.20.5+really1.20.2-1.1+deb12u1
CACHE=${BATCH_K8S_CACHE:-$HOME/.cache/airflow-batch-inference/k8s}
BINARIES=(kube-apiserver kubelet kube-scheduler kube-controller-manager)
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo

apt_install() { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null; }
# One build at a time per cache (two test sessions starting together): the second waits, then finds
# the binaries cached.
mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
flock 9
need=()
for tool in etcd:etcd-server containerd:containerd runc:runc busybox:busybox-static gcc:gcc tini:tini \
            buildah:buildah mmdebstrap:mmdebstrap; do
  command -v "${tool%%:*}" >/dev/null || need+=("${tool#*:}")
done
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
command -v openssl >/dev/null || need+=(openssl)
if [ ${#need[@]} -gt 0 ]; then $SUDO apt-get update -qq; apt_install "${need[@]}"; fi
[ "${1:-}" = --packages-only ] && exit 0

missing=()
for b in "${BINARIES[@]}"; do
  "$CACHE/$b-$VERSION" --version 2>/dev/null | grep -q "$VERSION" || missing+=("$b")
done
if [ ${#missing[@]} -eq 0 ] && [ -x "$CACHE/pause-$VERSION" ]; then
  echo "kubernetes $VERSION: cached in $CACHE"; exit 0
fi
if ! grep -rqs '^Types: deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
  $SUDO tee /etc/apt/sources.list.d/batch-inference-debian-src.sources >/dev/null <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
fi
$SUDO apt-get update -qq
apt_install golang-go rsync libc6-dev
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "kubernetes $VERSION: building ${missing[*]:-pause} from Debian source (once)"
( cd "$work" && apt-get source -qq --download-only "kubernetes=$SRC_VERSION" \
  && tar xzf kubernetes_1.20.5+really1.20.2.orig.tar.gz )
tree="$work/kubernetes-1.20.2"
if [ ${#missing[@]} -gt 0 ]; then
  what=$(printf 'cmd/%s ' "${missing[@]}")
  # GOPATH-mode build exactly as upstream's Makefile does (generators first, then the binaries).
  ( cd "$tree" && CGO_ENABLED=0 HOME="$work/home" make WHAT="$what" >"$work/build.log" 2>&1 ) \
    || { tail -40 "$work/build.log"; exit 1; }
  for b in "${missing[@]}"; do
    install -m 0755 "$tree/_output/bin/$b" "$CACHE/$b-$VERSION.tmp"
    mv "$CACHE/$b-$VERSION.tmp" "$CACHE/$b-$VERSION"
  done
fi
# The flags of upstream's build/pause/Makefile.
gcc -Os -Wall -Werror -static -DVERSION="$VERSION-local" -o "$CACHE/pause-$VERSION.tmp" "$tree/build/pause/linux/pause.c"
mv "$CACHE/pause-$VERSION.tmp" "$CACHE/pause-$VERSION"
for b in "${BINARIES[@]}"; do "$CACHE/$b-$VERSION" --version; done
