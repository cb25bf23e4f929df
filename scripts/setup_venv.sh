#!/usr/bin/env bash
# Create (or update) .venv with the Airflow side, the encoder worker and the dev tools in one
# environment: they resolve cleanly together; production keeps them in two images. Idempotent: a stamp
# records the pyproject.toml it was installed from; a changed pyproject re-runs the install in place.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
stamp="$VENV/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
[ -f "$stamp" ] && exit 0
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
# CPU torch from this machine's local wheel first, so no resolve ever pulls a CUDA build.
"$VENV/bin/pip" install -q torch==2.13.0
"$VENV/bin/pip" install -q -e '.[airflow,worker,dev]'
rm -f "$VENV"/.installed-*
touch "$stamp"
echo "environment ready: $VENV"
