#!/usr/bin/env bash
# Check, with `kubectl auth can-i`, that the Airflow side's Kubernetes identities may do in the worker
# namespace what the DAG's KubernetesPodOperator pods (and the Indexed Job alternative) need: every verb
# and resource of the Role airflow-pod-launcher in deploy/k8s/rbac.yaml (docs/kubernetes.md, section 4).
#
# Usage:
#   deploy/k8s/can-i.sh [--dry-run] [--namespace=NS] [--as=NAMESPACE:SERVICE_ACCOUNT]... [--context=CTX]
#
#   --namespace=NS   the worker namespace [batch-inference, or $WORKER_NAMESPACE]
#   --as=NS:SA       a Kubernetes service account to check (repeatable; replaces the defaults), checked as
#                    --as=system:serviceaccount:NS:SA. Defaults: the official Airflow Helm chart's worker and
#                    triggerer accounts, <fullname>-worker and <fullname>-triggerer in $AIRFLOW_NAMESPACE
#                    [airflow], where <fullname> is $RELEASE [airflow] when it contains "airflow", else
#                    $RELEASE-airflow (the chart's rule; $AIRFLOW_FULLNAME overrides it). With LocalExecutor
#                    the tasks run in the scheduler: add --as=airflow:airflow-scheduler and bind it in rbac.yaml.
#   --context=CTX    kubeconfig context passed to kubectl
#   --dry-run        print the kubectl commands (one per line, prefixed "+ "), run none
#
# Impersonation (--as) needs a user allowed to impersonate service accounts (e.g. cluster admin).
# Prints one line per check and a summary naming every missing permission.
# Exit status: 0 all allowed; 1 at least one permission missing; 2 usage error or kubectl failed.
set -euo pipefail

# The Role's rules (deploy/k8s/rbac.yaml), one "verb resource[/subresource]" per check.
# tests/unit/test_deploy_gcp.py checks that this list and rbac.yaml agree.
CHECKS=(
  "create pods" "get pods" "list pods" "watch pods" "patch pods" "delete pods"
  "get pods/log" "list pods/log"
  "get events" "list events" "watch events"
  "create jobs.batch" "get jobs.batch" "list jobs.batch" "watch jobs.batch" "patch jobs.batch" "delete jobs.batch"
  "create jobs.batch/status" "get jobs.batch/status" "list jobs.batch/status" "watch jobs.batch/status"
  "patch jobs.batch/status" "delete jobs.batch/status"
)

die() { printf 'can-i.sh: %s\n' "$*" >&2; exit 2; }

DRY_RUN=0
NAMESPACE=${WORKER_NAMESPACE:-batch-inference}
CONTEXT=()
IDENTITIES=()
for arg in "$@"; do
  case $arg in
    --dry-run) DRY_RUN=1 ;;
    --namespace=?*) NAMESPACE=${arg#--namespace=} ;;
    --as=?*:?*) IDENTITIES+=("${arg#--as=}") ;;
    --context=?*) CONTEXT=("$arg") ;;
    -h | --help)
      while IFS= read -r line; do
        [[ $line == '#!'* ]] && continue
        [[ $line == '#'* ]] || break
        line=${line#\#}; printf '%s\n' "${line# }"
      done <"$0"
      exit 0 ;;
    *) die "unknown argument: $arg (see --help)" ;;
  esac
done
if (( ${#IDENTITIES[@]} == 0 )); then
  airflow_ns=${AIRFLOW_NAMESPACE:-airflow}
  release=${RELEASE:-airflow}
  fullname=${AIRFLOW_FULLNAME:-}
  if [[ -z $fullname ]]; then
    if [[ $release == *airflow* ]]; then fullname=$release; else fullname=$release-airflow; fi
  fi
  IDENTITIES=("$airflow_ns:$fullname-worker" "$airflow_ns:$fullname-triggerer")
fi

show() {  # show ARG...: one "+ command" line, quoted as a shell reads it back
  local line="+" a
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then line+=" $a"; else line+=" '${a//\'/\'\\\'\'}'"; fi
  done
  printf '%s\n' "$line"
}

if [[ $DRY_RUN == 0 ]]; then
  command -v kubectl >/dev/null 2>&1 || die "kubectl not found on PATH, or use --dry-run"
fi

total=0
missing=()
failed=()
for identity in "${IDENTITIES[@]}"; do
  who="system:serviceaccount:$identity"
  for check in "${CHECKS[@]}"; do
    verb=${check%% *}
    target=${check#* }
    resource=${target%%/*}
    sub=()
    if [[ $target == */* ]]; then sub=(--subresource="${target#*/}"); fi
    cmd=(kubectl "${CONTEXT[@]}" auth can-i "$verb" "$resource" "${sub[@]}" --namespace="$NAMESPACE" --as="$who")
    total=$((total + 1))
    if [[ $DRY_RUN == 1 ]]; then show "${cmd[@]}"; continue; fi
    rc=0
    answer=$("${cmd[@]}" 2>&1) || rc=$?
    if [[ $rc == 0 && $answer == yes* ]]; then
      printf 'ok       %-40s %s %s\n' "$identity" "$verb" "$target"
    elif [[ $answer == no* ]]; then
      printf 'MISSING  %-40s %s %s\n' "$identity" "$verb" "$target"
      missing+=("$identity may not $verb $target in namespace $NAMESPACE")
    else
      printf 'ERROR    %-40s %s %s: %s\n' "$identity" "$verb" "$target" "${answer%%$'\n'*}"
      failed+=("$identity $verb $target")
    fi
  done
done

if [[ $DRY_RUN == 1 ]]; then exit 0; fi
if (( ${#failed[@]} > 0 )); then
  printf 'can-i: kubectl failed on %d of %d checks (is the cluster reachable, may you impersonate?)\n' \
    "${#failed[@]}" "$total"
  exit 2
fi
if (( ${#missing[@]} > 0 )); then
  printf 'can-i: %d of %d checks MISSING (apply deploy/k8s/rbac.yaml; its subjects must name these accounts):\n' \
    "${#missing[@]}" "$total"
  printf '  %s\n' "${missing[@]}"
  exit 1
fi
printf 'can-i: all %d checks allowed in namespace %s for %s\n' "$total" "$NAMESPACE" "${IDENTITIES[*]}"
