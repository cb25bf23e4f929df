#!/usr/bin/env bash
# Sourced by setup_venv.sh and setup_llm_venv.sh: keep a built environment in a cache folder keyed by a
# content hash of what it was built from, so a second checkout on the same machine (CI's fresh clone of
# the next commit) links it instead of installing for minutes. A fresh machine still builds everything.
#
#   venv_cache_link VENV KEY   -> 0 when VENV now links a cached environment built from KEY
#   venv_cache_path KEY        -> the cache folder for KEY (where a new environment is built)
#
# Cache root: $BATCH_CACHE_DIR (default ~/.cache/airflow-batch-inference). BATCH_VENV_CACHE=0 turns the
# cache off (VENV is then a plain folder, as before). An existing plain VENV folder is never replaced.
# A cached environment holds the project as an editable install; the caller re-points it at this
# checkout (`pip install --no-deps -e .`, seconds), so the newest checkout set up is the one it imports.
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

venv_cache_prune() {  # NAME_PREFIX KEEP_KEY: drop older environments of this kind (each is GBs)
  local prefix=$1 keep=$2 d
  for d in "$BATCH_CACHE_DIR/venvs/$prefix"-*; do
    [ -d "$d" ] && [ "$(basename "$d")" != "$keep" ] && rm -rf "$d"
  done
  return 0
}
