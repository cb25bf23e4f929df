#!/usr/bin/env bash
# Azurite (Microsoft's Azure Storage emulator) for the az:// storage tests (tests/azure_fixture.py).
#
#   scripts/ensure_azurite.sh   -> prints the path of Azurite's blob server entry point (main.js)
#
# Installs azurite@$AZURITE_VERSION from the npm registry once per machine into
# ${XDG_CACHE_HOME:-$HOME/.cache}/airflow-batch-inference/azurite-$AZURITE_VERSION (later runs only print
# the path). Needs node and npm (as root on Debian they are installed with apt-get when missing). Azurite 3.37 asks for Node 22 in its
# package.json but its blob server runs on Node 20 (npm prints an EBADENGINE warning, nothing more).
# Run it as: node <main.js> --blobHost 127.0.0.1 --blobPort N --inMemoryPersistence --skipApiVersionCheck
set -euo pipefail
AZURITE_VERSION=3.37.0
dir="${XDG_CACHE_HOME:-$HOME/.cache}/airflow-batch-inference/azurite-$AZURITE_VERSION"
main="$dir/node_modules/azurite/dist/src/blob/main.js"

if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "ensure_azurite: installing Node.js and npm from Debian (apt-get install nodejs npm)" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >&2
  fi
  for tool in node npm; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "ensure_azurite: '$tool' not found; install Node.js and npm" \
        "(Debian/Ubuntu: apt-get install nodejs npm)" >&2
      exit 1
    fi
  done
fi

if [[ ! -f "$main" ]]; then
  echo "ensure_azurite: installing azurite@$AZURITE_VERSION into $dir" >&2
  mkdir -p "$(dirname "$dir")"
  # A temp folder beside the final one, renamed when complete: a killed install leaves no half tree.
  tmp=$(mktemp -d "$dir.tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  npm install --no-audit --no-fund --loglevel=error --prefix "$tmp" "azurite@$AZURITE_VERSION" >&2 \
    || { echo "ensure_azurite: npm install azurite@$AZURITE_VERSION failed" >&2; exit 1; }
  [[ -f "$tmp/node_modules/azurite/dist/src/blob/main.js" ]] \
    || { echo "ensure_azurite: azurite@$AZURITE_VERSION installed no dist/src/blob/main.js" >&2; exit 1; }
  if [[ ! -f "$main" ]]; then  # not finished meanwhile by a concurrent run (pytest-xdist workers)
    rm -rf "$dir"
    mv -T "$tmp" "$dir" 2>/dev/null || true
  fi
  [[ -f "$main" ]] || { echo "ensure_azurite: $main missing after the install" >&2; exit 1; }
fi
echo "$main"
