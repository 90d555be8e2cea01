#!/usr/bin/env bash
# Sets everything up, then runs the main demo: a model trained on `neuron`, checked
# against CPU eager.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/setup.sh
PY=${PYTHON:-python3}
$PY -m neuron_eager.demo "$@"
