#!/usr/bin/env bash
# Throwaway PostgreSQL cluster for tests and benchmarks, on a free loopback port.
#
#   scripts/pg_test_cluster.sh start [DIR]   -> prints PG_TEST_DIR=... and PG_TEST_DSN=... (eval-able)
#   scripts/pg_test_cluster.sh stop DIR      -> stops the cluster and removes DIR
#   scripts/pg_test_cluster.sh install       -> only the package install below (make test runs it first)
#
# Installs Debian's `postgresql` package if no server binaries are found (non-interactive; needs root,
# as in CI on a fresh machine). When run as root, initdb and the server run as the unprivileged
# `postgres` user (created by the package; `nobody` otherwise), because PostgreSQL refuses to run as root.
# Auth is `trust` on 127.0.0.1 only; the socket lives in DIR. Nothing is left behind after `stop`.
set -euo pipefail

find_bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [[ -n "$d" && -x "$d/initdb" ]]; then echo "$d"; return; fi
  if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return; fi
  echo ""
}

ensure_installed() {
  if [[ -n "$(find_bindir)" ]]; then return; fi
  if [[ $(id -u) -ne 0 ]]; then
    echo "pg_test_cluster: PostgreSQL server binaries not found; install the 'postgresql' package" >&2
    exit 1
  fi
  echo "pg_test_cluster: installing Debian package postgresql" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends postgresql >&2
}

run_as() {  # run_as USER CMD... (plain exec when not root)
  local user=$1; shift
  if [[ $(id -u) -eq 0 ]]; then
    runuser -u "$user" -- "$@"
  else
    "$@"
  fi
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

start() {
  ensure_installed
  local bindir dir user port
  bindir=$(find_bindir)
  dir=${1:-$(mktemp -d /tmp/pgtest.XXXXXX)}
  mkdir -p "$dir"
  user=$(id -un)
  if [[ $(id -u) -eq 0 ]]; then
    user=postgres
    id -u postgres >/dev/null 2>&1 || user=nobody
    chown "$user" "$dir"
  fi
  chmod 700 "$dir"
  run_as "$user" "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; exit 1; }
  for attempt in 1 2 3; do
    port=$(free_port)
    if run_as "$user" "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-h 127.0.0.1 -p $port -k $dir -c max_wal_size=4GB" start >&2; then
      echo "$port" >"$dir/port"
      echo "PG_TEST_DIR=$dir"
      echo "PG_TEST_DSN=postgresql://postgres@127.0.0.1:$port/postgres"
      return
    fi
    echo "pg_test_cluster: start on port $port failed (attempt $attempt)" >&2
  done
  cat "$dir/server.log" >&2
  exit 1
}

stop() {
  local dir=${1:?usage: pg_test_cluster.sh stop DIR}
  local bindir user
  bindir=$(find_bindir)
  user=$(stat -c %U "$dir")
  if [[ -f "$dir/data/postmaster.pid" ]]; then
    run_as "$user" "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
  fi
  rm -rf "$dir"
}

case "${1:-}" in
  install) ensure_installed ;;
  start) start "${2:-}" ;;
  stop) stop "${2:-}" ;;
  *) echo "usage: $0 install | start [DIR] | stop DIR" >&2; exit 2 ;;
esac
