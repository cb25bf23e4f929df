#!/usr/bin/env bash
# Prepare a Google Cloud project for airflow-batch-inference on GKE (docs/deploy-gke.md, step 1).
#
# Idempotent: every resource is looked up (describe) before it is created, so a second run creates
# nothing; IAM bindings are added with add-iam-policy-binding, which leaves an existing binding as it is.
# It only creates and grants: it never deletes, resizes or edits a resource that already exists (a
# bucket that exists keeps its own lifecycle rules).
#
# Usage:
#   PROJECT=my-project deploy/gcp/setup.sh --dry-run    # print every command, run none (no gcloud needed)
#   PROJECT=my-project SQL_PASSWORD=... RESULTS_SQL_PASSWORD=... deploy/gcp/setup.sh
#   deploy/gcp/setup.sh --help
#
# Needs the gcloud CLI (gcloud storage for buckets; no gsutil) logged in as someone who may enable
# services, create GKE clusters, buckets, service accounts and Cloud SQL instances, and set IAM policy.
#
# Settings (environment variables; defaults in brackets):
#   PROJECT              Google Cloud project id (required)
#   REGION               region of the cluster, buckets, registry and Cloud SQL [us-central1]
#   ZONES                zones of the system and Airflow node pools [${REGION}-a]
#   GPU_ZONES            zones of the GPU spot pool; pick zones that offer ACCELERATOR
#                        (gcloud compute accelerator-types list) [${REGION}-a,${REGION}-b]
#   NETWORK              VPC network of the cluster and of Cloud SQL's private IP [default]
#   CLUSTER              GKE Standard cluster (regional, in REGION) [batch-inference]
#   RELEASE_CHANNEL      GKE release channel [regular]
#   SYSTEM_MACHINE       machine type of the cluster's default pool (1 node per zone) [e2-standard-2]
#   AIRFLOW_POOL         node pool of the Airflow components [airflow]
#   AIRFLOW_MACHINE      its machine type [e2-standard-4]
#   AIRFLOW_MIN_NODES / AIRFLOW_MAX_NODES   its autoscaling bounds, whole pool [1 / 3]
#   GPU_POOL             the spot GPU pool of the worker pods [gpu-spot]
#   GPU_MACHINE          its machine type (must take ACCELERATOR) [g2-standard-8]
#   ACCELERATOR          GPU type; the worker pods select it with cloud.google.com/gke-accelerator,
#                        so it must equal that key of BATCH_K8S_NODE_SELECTOR [nvidia-l4]
#   GPU_COUNT            GPUs per node [1]
#   GPU_MAX_NODES        autoscaling ceiling of the GPU pool (it scales from 0) [16]
#   GPU_LOCAL_SSD        local SSDs for ephemeral storage per GPU node; 0: none [1]
#   AR_REPO / AR_LOCATION  Artifact Registry docker repository and its location [batch-inference / REGION]
#   INPUT_BUCKET         bucket the runs read [${PROJECT}-batch-input]
#   OUTPUT_BUCKET        bucket of output_root (runs/, cache/, iceberg/) [${PROJECT}-batch-output]
#   OUTPUT_PREFIX        output_root inside OUTPUT_BUCKET: gs://OUTPUT_BUCKET/OUTPUT_PREFIX [batch]
#   RUN_RETENTION_DAYS   lifecycle rule of a new OUTPUT_BUCKET: delete objects under OUTPUT_PREFIX/runs/
#                        this many days after they were written; keep it above the longest run
#                        (deadline_hours) plus the time you want reports in the UI [45]
#   INPUT_RETENTION_DAYS lifecycle rule of a new INPUT_BUCKET: delete inputs this many days after they
#                        were written; 0: no rule [0]
#   LOGS_PREFIX          Airflow's remote task logs inside OUTPUT_BUCKET; deploy/helm/values-gke.yaml's
#                        remote_base_log_folder is gs://OUTPUT_BUCKET/airflow-logs [airflow-logs]
#   LOG_RETENTION_DAYS   lifecycle rule of a new OUTPUT_BUCKET: delete objects under LOGS_PREFIX/ this many
#                        days after they were written [30]
#   MODEL_BUCKET         optional bucket of model weights the worker pods read (not created) []
#   K8S_NAMESPACE        namespace of the worker pods (deploy/k8s/namespace.yaml) [batch-inference]
#   WORKER_KSA           Kubernetes service account of the worker pods [batch-worker]
#   AIRFLOW_NAMESPACE    namespace of the Airflow Helm release [airflow]
#   RELEASE              Helm release name of the official Apache Airflow chart [airflow]
#   AIRFLOW_FULLNAME     the chart's name prefix of its service accounts: RELEASE when RELEASE contains
#                        "airflow", else RELEASE-airflow (the chart's own rule) [derived]
#   WORKER_GSA           Google service account of the worker pods [batch-worker]
#   TASKS_GSA            ... of the Airflow task processes (workers; the scheduler too) [airflow-tasks]
#   TRIGGERER_GSA        ... of the Airflow triggerer [airflow-triggerer]
#   API_GSA              ... of the Airflow API server (the Batch inference UI page) [airflow-api-server]
#   NODE_GSA             ... of the GKE nodes (logging, monitoring, image pulls) [batch-gke-nodes]
#   CLOUDSQL             1: create the Cloud SQL for PostgreSQL instance below; 0: skip it [1]
#   SQL_INSTANCE         Cloud SQL instance (private IP on NETWORK only) [batch-inference-pg]
#   SQL_VERSION / SQL_TIER / SQL_EDITION   [POSTGRES_16 / db-custom-2-7680 / ENTERPRISE]
#   SQL_DB / SQL_USER    Airflow metadata database and its user [airflow / airflow]
#   SQL_PASSWORD         password of SQL_USER; required when that user does not exist yet
#   RESULTS_DB           database the postgres publish backend writes; empty: none [batch_results]
#   RESULTS_SQL_USER     its user [batch]
#   RESULTS_SQL_PASSWORD password of RESULTS_SQL_USER; required when that user does not exist yet
#   PSA_RANGE            reserved range of the private services access peering [google-managed-services-${NETWORK}]
#   DRY_RUN              1: same as --dry-run [0]
#
# Output: every command, before it runs, on stdout as one line "+ command" (shell quoting; passwords
# shown as <redacted>); progress notes on stderr. With --dry-run or DRY_RUN=1 nothing runs: each
# lookup is treated as "does not exist", so the output is the full list of commands of a first run.
set -euo pipefail

read -r -d '' USAGE <<'EOF' || true
Usage: PROJECT=<project id> deploy/gcp/setup.sh [--dry-run] [--help]

Prepares a Google Cloud project for airflow-batch-inference on GKE: services, Artifact Registry,
GKE cluster (Workload Identity) with an Airflow pool and a spot GPU pool, input/output buckets with
lifecycle rules, Google service accounts with bucket roles and Workload Identity bindings, and a
Cloud SQL for PostgreSQL instance (Airflow metadata + published results).

  --dry-run   print every command (one per line, prefixed "+ ") and run none; needs no gcloud
  --help      this text

Settings come from environment variables; the list with defaults is at the top of this script.
See docs/deploy-gke.md.
EOF

die() { printf 'setup.sh: %s\n' "$*" >&2; exit 2; }
note() { printf '== %s\n' "$*" >&2; }

DRY_RUN=${DRY_RUN:-0}
for arg in "$@"; do
  case $arg in
    --dry-run) DRY_RUN=1 ;;
    -h | --help) printf '%s\n' "$USAGE"; exit 0 ;;
    *) die "unknown argument: $arg (see --help)" ;;
  esac
done
[[ $DRY_RUN == 0 || $DRY_RUN == 1 ]] || die "DRY_RUN must be 0 or 1, not '$DRY_RUN'"

[[ -n ${PROJECT:-} ]] || die "set PROJECT to the Google Cloud project id (see --help)"
REGION=${REGION:-us-central1}
ZONES=${ZONES:-${REGION}-a}
GPU_ZONES=${GPU_ZONES:-${REGION}-a,${REGION}-b}
NETWORK=${NETWORK:-default}
CLUSTER=${CLUSTER:-batch-inference}
RELEASE_CHANNEL=${RELEASE_CHANNEL:-regular}
SYSTEM_MACHINE=${SYSTEM_MACHINE:-e2-standard-2}
AIRFLOW_POOL=${AIRFLOW_POOL:-airflow}
AIRFLOW_MACHINE=${AIRFLOW_MACHINE:-e2-standard-4}
AIRFLOW_MIN_NODES=${AIRFLOW_MIN_NODES:-1}
AIRFLOW_MAX_NODES=${AIRFLOW_MAX_NODES:-3}
GPU_POOL=${GPU_POOL:-gpu-spot}
GPU_MACHINE=${GPU_MACHINE:-g2-standard-8}
ACCELERATOR=${ACCELERATOR:-nvidia-l4}
GPU_COUNT=${GPU_COUNT:-1}
GPU_MAX_NODES=${GPU_MAX_NODES:-16}
GPU_LOCAL_SSD=${GPU_LOCAL_SSD:-1}
AR_REPO=${AR_REPO:-batch-inference}
AR_LOCATION=${AR_LOCATION:-$REGION}
INPUT_BUCKET=${INPUT_BUCKET:-${PROJECT}-batch-input}
OUTPUT_BUCKET=${OUTPUT_BUCKET:-${PROJECT}-batch-output}
OUTPUT_PREFIX=${OUTPUT_PREFIX-batch}
RUN_RETENTION_DAYS=${RUN_RETENTION_DAYS:-45}
INPUT_RETENTION_DAYS=${INPUT_RETENTION_DAYS:-0}
LOGS_PREFIX=${LOGS_PREFIX:-airflow-logs}
LOG_RETENTION_DAYS=${LOG_RETENTION_DAYS:-30}
MODEL_BUCKET=${MODEL_BUCKET:-}
K8S_NAMESPACE=${K8S_NAMESPACE:-batch-inference}
WORKER_KSA=${WORKER_KSA:-batch-worker}
AIRFLOW_NAMESPACE=${AIRFLOW_NAMESPACE:-airflow}
RELEASE=${RELEASE:-airflow}
if [[ -z ${AIRFLOW_FULLNAME:-} ]]; then
  # The official chart's "airflow.fullname": the release name when it contains the chart name.
  if [[ $RELEASE == *airflow* ]]; then AIRFLOW_FULLNAME=$RELEASE; else AIRFLOW_FULLNAME=$RELEASE-airflow; fi
fi
WORKER_GSA=${WORKER_GSA:-batch-worker}
TASKS_GSA=${TASKS_GSA:-airflow-tasks}
TRIGGERER_GSA=${TRIGGERER_GSA:-airflow-triggerer}
API_GSA=${API_GSA:-airflow-api-server}
NODE_GSA=${NODE_GSA:-batch-gke-nodes}
CLOUDSQL=${CLOUDSQL:-1}
SQL_INSTANCE=${SQL_INSTANCE:-batch-inference-pg}
SQL_VERSION=${SQL_VERSION:-POSTGRES_16}
SQL_TIER=${SQL_TIER:-db-custom-2-7680}
SQL_EDITION=${SQL_EDITION:-ENTERPRISE}
SQL_DB=${SQL_DB:-airflow}
SQL_USER=${SQL_USER:-airflow}
RESULTS_DB=${RESULTS_DB-batch_results}
RESULTS_SQL_USER=${RESULTS_SQL_USER:-batch}
PSA_RANGE=${PSA_RANGE:-google-managed-services-${NETWORK}}

for n in RUN_RETENTION_DAYS INPUT_RETENTION_DAYS LOG_RETENTION_DAYS GPU_COUNT GPU_MAX_NODES GPU_LOCAL_SSD AIRFLOW_MIN_NODES \
         AIRFLOW_MAX_NODES; do
  [[ ${!n} =~ ^[0-9]+$ ]] || die "$n must be a whole number, not '${!n}'"
done
(( RUN_RETENTION_DAYS > 0 && LOG_RETENTION_DAYS > 0 )) || die "RUN_RETENTION_DAYS and LOG_RETENTION_DAYS must be at least 1"
[[ $CLOUDSQL == 0 || $CLOUDSQL == 1 ]] || die "CLOUDSQL must be 0 or 1, not '$CLOUDSQL'"
for n in OUTPUT_PREFIX LOGS_PREFIX; do
  [[ ${!n} != /* && ${!n} != */ ]] || die "$n takes no leading or trailing '/'"
done

# Every command goes through run(): printed as "+ cmd" on fd 3 (stdout, also when a caller silences
# the command's own output), then executed unless DRY_RUN=1.
exec 3>&1
run() {
  local line="+" a
  for a in "$@"; do
    case $a in --password=*) a="--password=<redacted>" ;; esac
    if [[ $a =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
      line+=" $a"
    else  # single-quoted, as a shell reads it back
      line+=" '${a//\'/\'\\\'\'}'"
    fi
  done
  printf '%s\n' "$line" >&3
  [[ $DRY_RUN == 1 ]] && return 0
  "$@"
}

# exists CMD...: true when the lookup CMD succeeds. In dry mode the lookup is printed, not run, and
# counts as "does not exist", so the dry run lists what a first run would create.
exists() {
  if [[ $DRY_RUN == 1 ]]; then run "$@"; return 1; fi
  run "$@" >/dev/null 2>&1
}

# IAM bindings right after a service account was created can fail until the account is visible
# everywhere (eventual consistency): try a few times before giving up.
with_retries() {
  local i
  for i in 1 2 3 4; do
    "$@" && return 0
    printf 'setup.sh: retrying in %ss\n' "$((i * 5))" >&2
    sleep "$((i * 5))"
  done
  "$@"
}

if [[ $DRY_RUN == 0 ]]; then
  command -v gcloud >/dev/null 2>&1 || die "gcloud not found on PATH (install the Google Cloud CLI), or use --dry-run"
fi

P=(--project="$PROJECT")
LOC=(--location="$REGION")
POOL=(--workload-pool="${PROJECT}.svc.id.goog")
gsa_email() { printf '%s@%s.iam.gserviceaccount.com' "$1" "$PROJECT"; }
WORKER_EMAIL=$(gsa_email "$WORKER_GSA")
TASKS_EMAIL=$(gsa_email "$TASKS_GSA")
TRIGGERER_EMAIL=$(gsa_email "$TRIGGERER_GSA")
API_EMAIL=$(gsa_email "$API_GSA")
NODE_EMAIL=$(gsa_email "$NODE_GSA")

TMP_DIR=""
cleanup() { if [[ -n $TMP_DIR ]]; then rm -rf -- "$TMP_DIR"; fi; }
trap cleanup EXIT

# ------------------------------------------------------------------------------------------- services
note "services"
SERVICES=(container.googleapis.com artifactregistry.googleapis.com iam.googleapis.com
          iamcredentials.googleapis.com storage.googleapis.com)
if [[ $CLOUDSQL == 1 ]]; then
  SERVICES+=(sqladmin.googleapis.com servicenetworking.googleapis.com compute.googleapis.com)
fi
run gcloud services enable "${SERVICES[@]}" "${P[@]}"

# ----------------------------------------------------------------------------- Google service accounts
note "Google service accounts"
ensure_gsa() {  # ensure_gsa NAME EMAIL DISPLAY_NAME
  if ! exists gcloud iam service-accounts describe "$2" "${P[@]}"; then
    run gcloud iam service-accounts create "$1" --display-name="$3" "${P[@]}"
  fi
}
ensure_gsa "$NODE_GSA" "$NODE_EMAIL" "GKE nodes (batch inference)"
ensure_gsa "$WORKER_GSA" "$WORKER_EMAIL" "Batch inference worker pods"
ensure_gsa "$TASKS_GSA" "$TASKS_EMAIL" "Airflow tasks (batch inference)"
ensure_gsa "$TRIGGERER_GSA" "$TRIGGERER_EMAIL" "Airflow triggerer (batch inference)"
ensure_gsa "$API_GSA" "$API_EMAIL" "Airflow API server (batch inference)"

# The nodes' own identity: the minimal GKE node role (logs, metrics) instead of the Compute Engine
# default service account's Editor.
with_retries run gcloud projects add-iam-policy-binding "$PROJECT" --member="serviceAccount:$NODE_EMAIL" \
  --role=roles/container.defaultNodeServiceAccount --condition=None --quiet >/dev/null

# --------------------------------------------------------------------------------- Artifact Registry
note "Artifact Registry"
if ! exists gcloud artifacts repositories describe "$AR_REPO" --location="$AR_LOCATION" "${P[@]}"; then
  run gcloud artifacts repositories create "$AR_REPO" --repository-format=docker --location="$AR_LOCATION" \
    --description="batch inference images (worker, Airflow)" "${P[@]}"
fi
# The nodes pull the worker and Airflow images: read access on this repository only.
with_retries run gcloud artifacts repositories add-iam-policy-binding "$AR_REPO" --location="$AR_LOCATION" \
  --member="serviceAccount:$NODE_EMAIL" --role=roles/artifactregistry.reader "${P[@]}" >/dev/null

# ----------------------------------------------------------------------------------- cluster and pools
note "GKE cluster $CLUSTER"
if ! exists gcloud container clusters describe "$CLUSTER" "${LOC[@]}" "${P[@]}"; then
  # Workload Identity Federation for GKE on the cluster; the default pool (system pods) is small.
  run gcloud container clusters create "$CLUSTER" "${LOC[@]}" --node-locations="$ZONES" \
    --release-channel="$RELEASE_CHANNEL" --network="$NETWORK" --enable-ip-alias "${POOL[@]}" \
    --machine-type="$SYSTEM_MACHINE" --num-nodes=1 --service-account="$NODE_EMAIL" \
    --workload-metadata=GKE_METADATA "${P[@]}"
fi

note "node pool $AIRFLOW_POOL (Airflow)"
if ! exists gcloud container node-pools describe "$AIRFLOW_POOL" --cluster="$CLUSTER" "${LOC[@]}" "${P[@]}"; then
  run gcloud container node-pools create "$AIRFLOW_POOL" --cluster="$CLUSTER" "${LOC[@]}" --node-locations="$ZONES" \
    --machine-type="$AIRFLOW_MACHINE" --num-nodes=1 --enable-autoscaling \
    --total-min-nodes="$AIRFLOW_MIN_NODES" --total-max-nodes="$AIRFLOW_MAX_NODES" \
    --service-account="$NODE_EMAIL" --workload-metadata=GKE_METADATA "${P[@]}"
fi

note "node pool $GPU_POOL (spot $ACCELERATOR)"
# The placement of the worker pods (K8sSettings defaults in plugins/batch_inference/pod_spec.py):
#   nodeSelector cloud.google.com/gke-spot=true        <- GKE labels the nodes of a --spot pool so
#   nodeSelector cloud.google.com/gke-accelerator=ACC  <- GKE labels GPU nodes from --accelerator type
#   toleration nvidia.com/gpu Exists NoSchedule        -> taint nvidia.com/gpu=present:NoSchedule
#   toleration cloud.google.com/gke-spot=true NoSchedule -> taint cloud.google.com/gke-spot=true:NoSchedule
# Both taints are set here, so that nothing else lands on these nodes.
GPU_TAINTS="nvidia.com/gpu=present:NoSchedule,cloud.google.com/gke-spot=true:NoSchedule"
GPU_FLAGS=(--machine-type="$GPU_MACHINE"
           --accelerator="type=${ACCELERATOR},count=${GPU_COUNT},gpu-driver-version=latest"
           --spot --node-taints="$GPU_TAINTS"
           --num-nodes=0 --enable-autoscaling --total-min-nodes=0 --total-max-nodes="$GPU_MAX_NODES")
if (( GPU_LOCAL_SSD > 0 )); then
  GPU_FLAGS+=(--ephemeral-storage-local-ssd="count=${GPU_LOCAL_SSD}")
fi
if ! exists gcloud container node-pools describe "$GPU_POOL" --cluster="$CLUSTER" "${LOC[@]}" "${P[@]}"; then
  run gcloud container node-pools create "$GPU_POOL" --cluster="$CLUSTER" "${LOC[@]}" --node-locations="$GPU_ZONES" \
    "${GPU_FLAGS[@]}" --service-account="$NODE_EMAIL" --workload-metadata=GKE_METADATA "${P[@]}"
fi

# -------------------------------------------------------------------------------------------- buckets
note "buckets"
TMP_DIR=$(mktemp -d)  # lifecycle files (removed on exit)
lifecycle_file() {  # lifecycle_file NAME DAYS[:PREFIX]...: a lifecycle JSON, one Delete rule per argument
  local name=$1 rule days prefix cond rules="" json
  shift
  for rule in "$@"; do
    days=${rule%%:*}
    cond="\"age\": $days"
    if [[ $rule == *:* ]]; then prefix=${rule#*:}; cond+=", \"matchesPrefix\": [\"$prefix\"]"; fi
    rules+="${rules:+, }{\"action\": {\"type\": \"Delete\"}, \"condition\": {$cond}}"
  done
  json="{\"lifecycle\": {\"rule\": [$rules]}}"
  printf '%s\n' "$json" >"$TMP_DIR/$name.json"
  printf '%s: %s\n' "$TMP_DIR/$name.json" "$json" >&2
  printf '%s' "$TMP_DIR/$name.json"
}
ensure_bucket() {  # ensure_bucket BUCKET [LIFECYCLE_FILE]
  if ! exists gcloud storage buckets describe "gs://$1" "${P[@]}"; then
    local extra=()
    if [[ -n ${2:-} ]]; then extra=(--lifecycle-file="$2"); fi
    run gcloud storage buckets create "gs://$1" --location="$REGION" --uniform-bucket-level-access \
      --public-access-prevention "${extra[@]}" "${P[@]}"
  fi
}
RUNS_PREFIX=runs/
if [[ -n $OUTPUT_PREFIX ]]; then RUNS_PREFIX=$OUTPUT_PREFIX/runs/; fi
input_rules=""
if (( INPUT_RETENTION_DAYS > 0 )); then input_rules=$(lifecycle_file input "$INPUT_RETENTION_DAYS"); fi
ensure_bucket "$INPUT_BUCKET" "$input_rules"
ensure_bucket "$OUTPUT_BUCKET" \
  "$(lifecycle_file output "$RUN_RETENTION_DAYS:$RUNS_PREFIX" "$LOG_RETENTION_DAYS:$LOGS_PREFIX/")"

note "bucket roles"
grant_bucket() {  # grant_bucket BUCKET EMAIL ROLE [CONDITION]
  local condition=()
  if [[ -n ${4:-} ]]; then condition=(--condition="$4"); fi
  with_retries run gcloud storage buckets add-iam-policy-binding "gs://$1" --member="serviceAccount:$2" \
    --role="$3" "${condition[@]}" "${P[@]}" >/dev/null
}
# Worker pods: read the input; create, read back and list part files, markers and progress objects
# under the output root (objectUser: the progress object is rewritten); read the model weights.
grant_bucket "$INPUT_BUCKET" "$WORKER_EMAIL" roles/storage.objectViewer
grant_bucket "$OUTPUT_BUCKET" "$WORKER_EMAIL" roles/storage.objectUser
if [[ -n $MODEL_BUCKET ]]; then grant_bucket "$MODEL_BUCKET" "$WORKER_EMAIL" roles/storage.objectViewer; fi
# Airflow tasks: plan reads the input's metadata and writes the manifest; the gate reads markers; publish
# reads part files; report writes report.json/report.html.
grant_bucket "$INPUT_BUCKET" "$TASKS_EMAIL" roles/storage.objectViewer
grant_bucket "$OUTPUT_BUCKET" "$TASKS_EMAIL" roles/storage.objectUser
# Triggerer: the completion trigger lists and reads markers (no writes). API server: the UI page reads
# run directories (manifest, progress, reports, dead letters).
grant_bucket "$OUTPUT_BUCKET" "$TRIGGERER_EMAIL" roles/storage.objectViewer
grant_bucket "$OUTPUT_BUCKET" "$API_EMAIL" roles/storage.objectViewer
# Remote task logs under LOGS_PREFIX/: the task pods write them (objectUser above) and the API server
# reads them (objectViewer above); the triggerer uploads its part of deferred tasks' logs, so it may also
# write there, and only there (an IAM condition on the object name).
grant_bucket "$OUTPUT_BUCKET" "$TRIGGERER_EMAIL" roles/storage.objectUser \
  "expression=resource.name.startsWith(\"projects/_/buckets/$OUTPUT_BUCKET/objects/$LOGS_PREFIX/\"),title=airflow-logs-only"

# --------------------------------------------------------------------------------- Workload Identity
note "Workload Identity bindings"
bind_ksa() {  # bind_ksa EMAIL NAMESPACE KSA: the Kubernetes service account may act as the GSA
  with_retries run gcloud iam service-accounts add-iam-policy-binding "$1" --role=roles/iam.workloadIdentityUser \
    --member="serviceAccount:${PROJECT}.svc.id.goog[$2/$3]" "${P[@]}" >/dev/null
}
bind_ksa "$WORKER_EMAIL" "$K8S_NAMESPACE" "$WORKER_KSA"
# Official Airflow chart service accounts: <fullname>-worker (Celery workers, KubernetesExecutor task
# pods), <fullname>-scheduler (runs the tasks with LocalExecutor), <fullname>-triggerer, <fullname>-api-server.
bind_ksa "$TASKS_EMAIL" "$AIRFLOW_NAMESPACE" "${AIRFLOW_FULLNAME}-worker"
bind_ksa "$TASKS_EMAIL" "$AIRFLOW_NAMESPACE" "${AIRFLOW_FULLNAME}-scheduler"
bind_ksa "$TRIGGERER_EMAIL" "$AIRFLOW_NAMESPACE" "${AIRFLOW_FULLNAME}-triggerer"
bind_ksa "$API_EMAIL" "$AIRFLOW_NAMESPACE" "${AIRFLOW_FULLNAME}-api-server"

# ------------------------------------------------------------------------------------------ Cloud SQL
if [[ $CLOUDSQL == 1 ]]; then
  note "Cloud SQL $SQL_INSTANCE (private IP on $NETWORK)"
  # Private services access: a reserved range peered with Google's service network, once per VPC.
  if ! exists gcloud compute addresses describe "$PSA_RANGE" --global "${P[@]}"; then
    run gcloud compute addresses create "$PSA_RANGE" --global --purpose=VPC_PEERING --prefix-length=16 \
      --network="$NETWORK" "${P[@]}"
  fi
  peering=$(run gcloud services vpc-peerings list --network="$NETWORK" --service=servicenetworking.googleapis.com \
    --format='value(peering)' "${P[@]}")
  if [[ -z $peering ]]; then
    run gcloud services vpc-peerings connect --service=servicenetworking.googleapis.com --ranges="$PSA_RANGE" \
      --network="$NETWORK" "${P[@]}"
  fi
  if ! exists gcloud sql instances describe "$SQL_INSTANCE" "${P[@]}"; then
    run gcloud sql instances create "$SQL_INSTANCE" --database-version="$SQL_VERSION" --edition="$SQL_EDITION" \
      --tier="$SQL_TIER" --region="$REGION" --network="$NETWORK" --no-assign-ip --storage-auto-increase \
      --deletion-protection "${P[@]}"
  fi
  ensure_db() {  # ensure_db DATABASE
    if ! exists gcloud sql databases describe "$1" --instance="$SQL_INSTANCE" "${P[@]}"; then
      run gcloud sql databases create "$1" --instance="$SQL_INSTANCE" "${P[@]}"
    fi
  }
  ensure_user() {  # ensure_user USER PASSWORD_VARIABLE
    if ! exists gcloud sql users describe "$1" --instance="$SQL_INSTANCE" "${P[@]}"; then
      local password=${!2:-}
      if [[ -z $password ]]; then
        [[ $DRY_RUN == 1 ]] || die "$2 is not set: it is the password of the new Cloud SQL user $1"
        password="dry-run"  # shown as <redacted>; nothing runs
      fi
      run gcloud sql users create "$1" --instance="$SQL_INSTANCE" --password="$password" "${P[@]}"
    fi
  }
  ensure_db "$SQL_DB"
  ensure_user "$SQL_USER" SQL_PASSWORD
  if [[ -n $RESULTS_DB ]]; then
    ensure_db "$RESULTS_DB"
    ensure_user "$RESULTS_SQL_USER" RESULTS_SQL_PASSWORD
  fi
fi

note "done. Next: docs/deploy-gke.md, step 2 (images)."
printf '# output_root: gs://%s%s   worker image: %s-docker.pkg.dev/%s/%s/batch-worker\n' \
  "$OUTPUT_BUCKET" "${OUTPUT_PREFIX:+/$OUTPUT_PREFIX}" "$AR_LOCATION" "$PROJECT" "$AR_REPO" >&2
