#!/usr/bin/env bash
# What `make test-ui` needs besides the venv: Debian's chromium + chromium-driver and Selenium.
# Usage: scripts/ensure_browser.sh <venv dir>
set -euo pipefail
VENV="${1:-.venv}"
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null \
    || { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium chromium-driver >/dev/null; }
fi
"$VENV/bin/python" -c "import selenium" 2>/dev/null || "$VENV/bin/pip" install -q "selenium>=4.20,<5"
