#!/usr/bin/env bash
# batch-worker-sync-model: copy pinned model weights to local disk once, then run a command.
#
# Installed in the worker image as /usr/local/bin/batch-worker-sync-model. The image's ENTRYPOINT stays
# ["tini", "--", "batch-worker"]; use this script as an init container (command: [batch-worker-sync-model]) that fills
# a volume shared with the worker container, or as a wrapper (command: [batch-worker-sync-model,
# batch-worker], args: [run, ...]). The image build uses it too, to bake weights in (build arg MODEL_URI).
#
# Usage:
#   batch-worker-sync-model [COMMAND [ARG...]]   sync (when MODEL_URI is set), then exec COMMAND
#   batch-worker-sync-model --write-sums DIR     write DIR/SHA256SUMS, print its sha256 (the pin)
#
# Environment:
#   MODEL_URI                  gs://bucket/prefix, s3://bucket/prefix, az://container/prefix,
#                              file:///path or /path; empty: no sync, just exec.
#   MODEL_SHA256               sha256 (64 hex) of the source's SHA256SUMS file. Required with MODEL_URI:
#                              it pins the exact bytes, whatever the URI later points at.
#   MODEL_DIR                  destination directory (default /models/model); its parent must be writable.
#   MODEL_SYNC_JITTER_SECONDS  sleep a random 0..N s before downloading (default 0), so that N pods
#                              started together do not all hit the bucket in the same second.
#   MODEL_SYNC_LOCK_TIMEOUT    seconds to wait for another process syncing the same MODEL_DIR (default
#                              3600). Pods sharing a node-local cache (hostPath) download once per node.
#   GOOGLE_APPLICATION_CREDENTIALS  optional key file for gs:// (Workload Identity needs none).
#   AWS_* / AZURE_STORAGE_*    endpoint, region, account and credentials for s3:// and az:// (docs/storage.md).
#
# Exit codes (batch_contract.enums.ExitCode): 2 configuration error (missing/invalid MODEL_SHA256,
# checksum mismatch, an object name with an empty, '.' or '..' segment: retrying cannot fix it), 1 transient failure (download error: retried).
set -euo pipefail

readonly SUMS=SHA256SUMS
readonly DONE_MARK=.sync-complete

log() { printf 'batch-worker-sync-model: %s\n' "$*" >&2; }
bad_config() { log "configuration error: $*"; exit 2; }

write_sums() {
  local dir=$1 listing
  [[ -d "$dir" ]] || bad_config "--write-sums: $dir is not a directory"
  listing=$(mktemp)
  (
    cd "$dir"
    find . -type f ! -name "$SUMS" ! -name "$DONE_MARK" -printf '%P\0' | sort -z \
      | xargs -0 -r sha256sum -- > "$listing"
  )
  chmod 0644 "$listing"
  mv -- "$listing" "$dir/$SUMS"
  sha256sum "$dir/$SUMS" | cut -d' ' -f1
}

download_gcs() {
  # $1: gs://bucket/prefix   $2: destination directory. Parallel, chunked downloads per object.
  python3 - "$1" "$2" <<'PY'
import os
import sys

from google.cloud import storage
from google.cloud.storage import transfer_manager

uri, dest = sys.argv[1], sys.argv[2]
bucket_name, _, prefix = uri[len("gs://"):].partition("/")
prefix = prefix.rstrip("/") + "/" if prefix else ""
client = storage.Client()
names = [b.name[len(prefix):] for b in client.list_blobs(bucket_name, prefix=prefix)
         if not b.name.endswith("/")]
if not names:
    sys.exit(f"no objects under {uri}")
unsafe = [n for n in names if n.startswith("/") or {"", ".", ".."} & set(n.split("/"))]
if unsafe:  # such a name would be written outside the destination directory
    print(f"configuration error: object names under {uri} with an empty, '.' or '..' segment: {unsafe[:5]}",
          file=sys.stderr)
    sys.exit(2)
transfer_manager.download_many_to_path(
    client.bucket(bucket_name), names, destination_directory=dest, blob_name_prefix=prefix,
    max_workers=8, worker_type=transfer_manager.THREAD, raise_exception=True)
print(f"downloaded {len(names)} objects from {uri}", file=sys.stderr)
PY
}

download_store() {
  # $1: s3://bucket/prefix or az://container/prefix   $2: destination directory. Through the project's
  # storage backends (batch_contract.storage: the endpoint, region, account and credentials they read).
  python3 - "$1" "$2" <<'PY'
import sys
from pathlib import Path

from batch_contract import storage

uri, dest = sys.argv[1].rstrip("/"), Path(sys.argv[2])
backend = storage.backend_for(uri)
_, base = storage.arrow_filesystem(uri + "/")
paths = storage.list_tree(uri)
if not paths:
    sys.exit(f"no objects under {uri}")
relative = {path: path[len(base.rstrip("/")) + 1:] for path in paths}
unsafe = [r for r in relative.values() if r.startswith("/") or {"", ".", ".."} & set(r.split("/"))]
if unsafe:  # such a name would be written outside the destination directory
    print(f"configuration error: object names under {uri} with an empty, '.' or '..' segment: {unsafe[:5]}",
          file=sys.stderr)
    sys.exit(2)
for path in paths:
    storage.localize(backend.uri_from_arrow_path(path), dest / relative[path])
print(f"downloaded {len(paths)} objects from {uri}", file=sys.stderr)
PY
}

fetch() {
  # $1: source URI   $2: empty destination directory
  local src=$1 dest=$2
  case "$src" in
    gs://*) download_gcs "$src" "$dest" ;;
    s3://*|az://*) download_store "$src" "$dest" ;;
    file://*) cp -a -- "${src#file://}/." "$dest/" ;;
    /*) cp -a -- "$src/." "$dest/" ;;
    *) bad_config "MODEL_URI $src is not gs://, s3://, az://, file:// or an absolute path" ;;
  esac
}

verify() {
  # $1: directory holding a SHA256SUMS file whose own sha256 must equal MODEL_SHA256.
  local dir=$1 listed present
  [[ -f "$dir/$SUMS" ]] || bad_config "$MODEL_URI has no $SUMS file (create it with --write-sums)"
  if [[ "$(sha256sum "$dir/$SUMS" | cut -d' ' -f1)" != "$MODEL_SHA256" ]]; then
    bad_config "$MODEL_URI/$SUMS does not match MODEL_SHA256=$MODEL_SHA256 (the source changed?)"
  fi
  (cd "$dir" && sha256sum --check --strict --quiet "$SUMS") \
    || bad_config "a file under $MODEL_URI does not match its checksum in $SUMS"
  listed=$(cut -d' ' -f3- "$dir/$SUMS" | sort)
  present=$(cd "$dir" && find . -type f ! -name "$SUMS" ! -name "$DONE_MARK" -printf '%P\n' | sort)
  [[ "$listed" == "$present" ]] || bad_config "files under $MODEL_URI differ from those listed in $SUMS"
}

sync_model() {
  local dest=${MODEL_DIR:-/models/model}
  [[ "${MODEL_SHA256:-}" =~ ^[0-9a-f]{64}$ ]] \
    || bad_config "MODEL_SHA256 must be the 64-hex sha256 of $SUMS (printed by --write-sums)"
  mkdir -p -- "$(dirname -- "$dest")"
  exec 9> "$dest.lock"
  flock -w "${MODEL_SYNC_LOCK_TIMEOUT:-3600}" 9 || { log "timed out waiting for $dest.lock"; exit 1; }
  if [[ "$(cat -- "$dest/$DONE_MARK" 2>/dev/null || true)" == "$MODEL_SHA256" ]]; then
    log "$dest already holds $MODEL_SHA256"
    return 0
  fi
  local jitter=${MODEL_SYNC_JITTER_SECONDS:-0}
  [[ "$jitter" =~ ^[0-9]+$ ]] || bad_config "MODEL_SYNC_JITTER_SECONDS=$jitter is not a whole number"
  if (( jitter > 0 )); then sleep $(( RANDOM % (jitter + 1) )); fi
  local tmp="$dest.tmp-$$"
  rm -rf -- "$tmp"
  mkdir -p -- "$tmp"
  # shellcheck disable=SC2064  # expanded now: $tmp is local to this function, the trap runs at exit
  trap "rm -rf -- $(printf '%q' "$tmp")" EXIT
  log "syncing $MODEL_URI -> $dest"
  fetch "$MODEL_URI" "$tmp"
  verify "$tmp"
  printf '%s' "$MODEL_SHA256" > "$tmp/$DONE_MARK"
  rm -rf -- "$dest"
  mv -- "$tmp" "$dest"
  trap - EXIT
  log "synced $(wc -l < "$dest/$SUMS") files into $dest"
}

main() {
  if [[ "${1:-}" == "--write-sums" ]]; then
    [[ $# -eq 2 ]] || bad_config "usage: --write-sums DIR"
    write_sums "$2"
    return 0
  fi
  if [[ -n "${MODEL_URI:-}" ]]; then
    sync_model
  fi
  exec 9>&-
  if [[ $# -gt 0 ]]; then
    exec "$@"
  fi
}

main "$@"
