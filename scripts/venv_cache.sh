#!/usr/bin/env bash
# Sourced by setup_venv.sh and setup_llm_venv.sh: keep a built environment in a cache folder keyed by a
# content hash of what it was built from, so a second checkout on the same machine (CI's fresh clone of
# the next commit) links it instead of installing for minutes. A fresh machine still builds everything.
#
#   venv_cache_wanted VENV                  -> 0 when VENV should link a cached environment
#   venv_cache_setup VENV KEY PREFIX BUILD  -> link the environment cached for KEY, building it first
#                                              with the function BUILD (its folder as argument) when
#                                              missing; older PREFIX-* environments are removed
# Call venv_cache_setup as a plain command (not in `if`, `&&` or `||`), so `set -e` stops a failed build.
#
# Cache root: $BATCH_CACHE_DIR (default ~/.cache/airflow-batch-inference). BATCH_VENV_CACHE=0 turns the
# cache off (VENV is then a plain folder, as before). An existing plain VENV folder is never replaced.
# A cached environment holds the project as an editable install; the caller re-points it at this
# checkout (`pip install --no-deps -e .`, seconds), so the newest checkout set up is the one it imports
# (make run and the tests put their own plugins/ and worker_image/ first on the path; docs/testing.md).
BATCH_CACHE_DIR=${BATCH_CACHE_DIR:-$HOME/.cache/airflow-batch-inference}

venv_cache_enabled() { [ "${BATCH_VENV_CACHE:-1}" != 0 ]; }

venv_cache_path() { echo "$BATCH_CACHE_DIR/venvs/$1"; }

venv_cache_link() {  # VENV KEY
  local venv=$1 key=$2 cached
  venv_cache_enabled || return 1
  cached=$(venv_cache_path "$key")
  [ -f "$cached/.complete" ] || return 1
  if [ -e "$venv" ] && [ ! -L "$venv" ]; then return 1; fi
  ln -sfn "$cached" "$venv"
}

venv_cache_wanted() {  # VENV: the cache is on and VENV is a link or absent (never a plain folder)
  venv_cache_enabled && { [ -L "$1" ] || [ ! -e "$1" ]; }
}

venv_cache_repoint() {  # VENV: the cached environment's editable install -> this checkout
  local venv=$1 here
  here=$(pwd -P)
  [ "$(cat "$venv/.checkout" 2>/dev/null)" = "$here" ] && return 0
  "$venv/bin/pip" install -q --no-deps -e .
  echo "$here" >"$venv/.checkout"
}

venv_cache_setup() {  # VENV KEY PREFIX BUILD
  local venv=$1 key=$2 prefix=$3 build=$4 cached
  cached=$(venv_cache_path "$key")
  if [ ! -f "$cached/.complete" ]; then
    rm -rf "$cached"  # a build that did not finish
    mkdir -p "$(dirname "$cached")"
    "$build" "$cached"
    pwd -P >"$cached/.checkout"
    touch "$cached/.complete"
    venv_cache_prune "$prefix" "$key"
    echo "environment ready: $venv -> $cached"
  fi
  venv_cache_link "$venv" "$key"
  venv_cache_repoint "$venv"
}

venv_cache_prune() {  # NAME_PREFIX KEEP_KEY: drop older environments of this kind (each is GBs)
  local prefix=$1 keep=$2 d
  for d in "$BATCH_CACHE_DIR/venvs/$prefix"-*; do
    [ -d "$d" ] && [ "$(basename "$d")" != "$keep" ] && rm -rf "$d"
  done
  return 0
}
