#!/usr/bin/env bash
# Sets up a fresh Debian machine: system packages, Python packages (torch 2.13.0 CPU from
# this machine's disk), then builds and installs neuron-eager. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(meson ninja-build pkg-config g++ libtbb-dev libxxhash-dev libspdlog-dev
              libgtest-dev libbenchmark-dev chromium valgrind)
missing=()
for p in "${APT_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
# torch first and pinned: the CPU wheel on disk, never a CUDA build pulled by a range.
if ! $PY -c "import torch,sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  $PY -m pip install -q torch==2.13.0
fi
$PY -m pip install -q "torch==2.13.0" meson-python "meson>=1.1" ninja pytest expecttest \
  hypothesis transformers accelerate "diffusers==0.42.*" peft trl datasets numpy matplotlib

echo "[setup] building neuron-eager (meson-python, no build isolation)"
TORCH_DEVICE_BACKEND_AUTOLOAD=0 $PY -m pip install -q --no-build-isolation --no-deps \
  -Cbuild-dir=build/py .
$PY -c "import torch; assert torch.neuron.device_count() > 0; print('[setup] neuron device ready:', torch.neuron.device_count(), 'cores')"
