#!/usr/bin/env bash
# Rebuilds and reinstalls neuron-eager incrementally (build/py), serialised by a lock so
# several developers (or helpers) on one machine never build or install at the same time.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
exec flock /tmp/neuron-eager-build.lock env TORCH_DEVICE_BACKEND_AUTOLOAD=0 \
  $PY -m pip install -q --no-build-isolation --no-deps -Cbuild-dir=build/py . "$@"
