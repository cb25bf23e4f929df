#!/usr/bin/env bash
# Build the live-cluster parts the Kubernetes tests need, once, and cache them:
#   - kube-apiserver v1.20.2 from Debian bookworm's `kubernetes` source package (the full upstream tree
#     with vendor/), built with Debian's Go 1.19: about 10 CPU-minutes cold, a ~110 MB binary;
#   - etcd from Debian's `etcd-server` (3.4.x).
# Idempotent: a cached binary of the right version is reused (a second run builds nothing).
# Cache: $BATCH_K8S_CACHE (default ~/.cache/airflow-batch-inference/k8s). Needs apt (root or sudo).
# Facts behind this recipe: ../shared/notes/k8s-live-apiserver/README.md (measured 2026-12-01).
set -euo pipefail
VERSION=v1.20.2
SRC_VERSION=1.20.5+really1.20.2-1.1+deb12u1
CACHE=${BATCH_K8S_CACHE:-$HOME/.cache/airflow-batch-inference/k8s}
BIN="$CACHE/kube-apiserver-$VERSION"
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo

apt_install() { $SUDO apt-get install -y -qq "$@" >/dev/null; }
# One build at a time per cache (two test sessions starting together): the second waits, then finds
# the binary cached.
mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
flock 9
command -v etcd >/dev/null || { $SUDO apt-get update -qq; apt_install etcd-server; }
command -v openssl >/dev/null || apt_install openssl
if [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -q "$VERSION"; then
  echo "kube-apiserver: cached $BIN"; exit 0
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
apt_install golang-go rsync
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "kube-apiserver: building $VERSION from Debian source (about 10 CPU-minutes, once)"
( cd "$work" && apt-get source -qq --download-only "kubernetes=$SRC_VERSION" \
  && tar xzf kubernetes_1.20.5+really1.20.2.orig.tar.gz )
# GOPATH-mode build exactly as upstream's Makefile does (generators first, then the binary).
( cd "$work/kubernetes-1.20.2" && CGO_ENABLED=0 HOME="$work/home" \
  make WHAT=cmd/kube-apiserver >"$work/build.log" 2>&1 ) || { tail -40 "$work/build.log"; exit 1; }
install -m 0755 "$work/kubernetes-1.20.2/_output/bin/kube-apiserver" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
"$BIN" --version
