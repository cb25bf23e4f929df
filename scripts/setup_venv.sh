#!/usr/bin/env bash
# Create (or update) .venv with the Airflow side, the encoder worker and the dev tools in one
# environment: they resolve cleanly together; production keeps them in two images. Idempotent: a stamp
# records the inputs it was installed from (pyproject.toml and this script); a change re-installs.
# Without a .venv folder, the environment is built once per machine in the cache folder
# (scripts/venv_cache.sh: keyed by those inputs and the Python version) and .venv links it; a second
# checkout links the same one and only re-points the project's editable install (seconds).
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/.."
. scripts/venv_cache.sh
VENV=${VENV:-.venv}
hash=$(cat pyproject.toml "$self" | sha256sum | cut -c1-16)
stamp=".installed-$hash"
key="main-$(python3 -c 'import sys; print("py%d%d" % sys.version_info[:2])')-$hash"

install() {  # DIR: build the environment in DIR
  local dir=$1
  [ -x "$dir/bin/python" ] || python3 -m venv "$dir"
  "$dir/bin/pip" install -q --upgrade pip
  # CPU torch from this machine's local wheel first, so no resolve ever pulls a CUDA build.
  "$dir/bin/pip" install -q torch==2.13.0
  "$dir/bin/pip" install -q -e '.[airflow,worker,dev]'
  rm -f "$dir"/.installed-*
  touch "$dir/$stamp"
}

if venv_cache_wanted "$VENV"; then
  venv_cache_setup "$VENV" "$key" install
  exit 0
fi
venv_cache_unlink "$VENV"
[ -f "$VENV/$stamp" ] && exit 0
install "$VENV"
echo "environment ready: $VENV"
