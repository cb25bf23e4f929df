#!/usr/bin/env bash
# Sourced by setup_venv.sh and setup_llm_venv.sh: keep a built environment in a cache folder keyed by a
# content hash of what it was built from, so a second checkout on the same machine (CI's fresh clone of
# the next commit) links it instead of installing for minutes. A fresh machine still builds everything.
#
#   venv_cache_wanted VENV                  -> 0 when VENV should link a cached environment
#   venv_cache_setup VENV KEY BUILD         -> link the environment cached for KEY (NAME-HASH), building
#                                              it first with the function BUILD (its folder as argument)
#                                              when missing, one build at a time (flock); the other
#                                              NAME-* environments are removed
#   venv_cache_unlink VENV                  -> VENV back to a plain folder to build in place (no cache)
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

venv_cache_unlink() {  # VENV: a link to a cached environment is removed (the cache itself is kept)
  if [ -L "$1" ]; then rm -f "$1"; fi
}

venv_cache_setup() {  # VENV KEY BUILD
  local venv=$1 key=$2 build=$3 cached
  cached=$(venv_cache_path "$key")
  mkdir -p "$(dirname "$cached")"
  exec 8>"$cached.lock"
  flock 8  # a second setup of the same KEY waits, then finds it complete
  if [ ! -f "$cached/.complete" ]; then
    rm -rf "$cached"  # a build that did not finish
    mkdir -p "$(dirname "$cached")"
    "$build" "$cached"
    pwd -P >"$cached/.checkout"
    touch "$cached/.complete"
    venv_cache_prune "${key%-*}" "$key"
    echo "environment ready: $venv -> $cached"
  fi
  venv_cache_link "$venv" "$key"
  venv_cache_repoint "$venv"
  exec 8>&-
}

venv_cache_prune() {  # NAME KEEP_KEY: drop the other NAME-<hash> environments (each is GBs)
  local name=$1 keep=$2 d
  for d in "$BATCH_CACHE_DIR/venvs/$name"-*; do
    case "$d" in *.lock) continue ;; esac
    [ -d "$d" ] && [ "$(basename "$d")" != "$keep" ] && rm -rf "$d" "$d.lock"
  done
  return 0
}
