#!/usr/bin/env bash
# Debian's tesseract OCR engine and its English data, for the documents stage (scanned PDF pages and
# images; docs/documents.md) and its tests. Installed with apt-get when the binary is missing (needs
# root, as in CI on a fresh machine); otherwise says what to install. Idempotent.
set -euo pipefail
if command -v tesseract >/dev/null 2>&1 && tesseract --list-langs 2>/dev/null | grep -qx eng; then
  exit 0
fi
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure_tesseract: tesseract with English data not found; install Debian's tesseract-ocr tesseract-ocr-eng" >&2
  exit 1
fi
echo "ensure_tesseract: installing Debian packages tesseract-ocr tesseract-ocr-eng" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get install -y -qq --no-install-recommends tesseract-ocr tesseract-ocr-eng >&2 \
  || { apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends tesseract-ocr tesseract-ocr-eng >&2; }
