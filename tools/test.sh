#!/usr/bin/env bash
# Sets everything up, then runs every test: C++ unit tests (also under sanitizers) and the
# Python suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup.sh
PY=${PYTHON:-python3}
echo "[test] C++ unit tests"
meson test -C build/py --suite cpp --print-errorlogs
echo "[test] C++ unit tests under ASan+UBSan and TSan (build/asan, build/tsan)"
./tools/sanitize.sh
echo "[test] Python tests"
$PY -m pytest tests/python -q -ra "$@"
