#!/usr/bin/env bash
# LLM GPU smoke: the vLLM half of the GPU checks, for a GPU node running the worker image (CUDA torch and
# the CUDA `vllm` package); no network, under 5 minutes.
#
#   bash bench/gpu_smoke.sh [RESULTS_JSON]     (default: bench/results/gpu_smoke-<UTC date>.json)
#
# The encoder is checked by bench/gpu_check.py instead (it also runs on a lent GPU machine without vLLM or
# the MiniLM package; see bench/results/README.md). vLLM cannot run on the lent machine (not installed,
# wheels over the 64 MiB a call carries), so this script needs a node with the worker image.
# Every step has its own time limit and records either its figures or why it did not run:
#   gpu   nvidia-smi name, memory, driver
#   llm   bench/llm.py on a locally built random Llama (hidden 1024, 8 layers): direct LLM.generate vs the
#         worker, output tokens/s, prefix-cache hit rate
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH="plugins:worker_image${PYTHONPATH:+:$PYTHONPATH}"
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
RESULTS=${1:-bench/results/gpu_smoke-$(date -u +%Y%m%dT%H%M%SZ).json}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$(dirname "$RESULTS")"
started=$(date +%s)

step() {  # step NAME SECONDS CMD...: run CMD with a time limit; its last stdout line (JSON) -> $WORK/NAME.json
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s)" >&2
  local t0=$(date +%s)
  timeout --signal=TERM --kill-after=15 "$limit" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err"
  local rc=$?
  if [ $rc -eq 0 ] && tail -n 1 "$WORK/$name.out" | "$PY" -c 'import json,sys; json.loads(sys.stdin.read())' 2>/dev/null; then
    tail -n 1 "$WORK/$name.out" >"$WORK/$name.json"
  else
    tail -n 3 "$WORK/$name.err" | "$PY" -c 'import json,sys; print(json.dumps({"skipped": True,
      "exit_code": int(sys.argv[1]), "why": sys.stdin.read()[-400:].strip()}))' "$rc" >"$WORK/$name.json"
  fi
  echo "   $name: rc=$rc in $(( $(date +%s) - t0 ))s: $(cut -c1-300 "$WORK/$name.json")" >&2
}

step gpu 20 "$PY" - <<'EOF'
import json, subprocess
q = "name,memory.total,driver_version"
out = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True,
                     text=True, check=True).stdout.strip().splitlines()
print(json.dumps({"gpus": [dict(zip(q.split(","), [x.strip() for x in line.split(",")])) for line in out]}))
EOF

# Two vLLM engines live in one process (direct, then the worker): give each under half the GPU.
VLLM_ENABLE_V1_MULTIPROCESSING=1 step llm 240 "$PY" bench/llm.py --prompts 2000 --max-tokens 128 \
  --prefix-tokens 300 --repeats 1 --hidden 1024 --layers 8 --gpu-memory-utilization 0.4

"$PY" - "$WORK" "$RESULTS" "$started" <<'EOF'
import json, sys, time
from pathlib import Path
work, out, started = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
result = {"bench": "gpu_smoke", "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
          "wall_s": int(time.time()) - started}
for name in ("gpu", "llm"):
    result[name] = json.loads((work / f"{name}.json").read_text())
out.write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps(result))
EOF
