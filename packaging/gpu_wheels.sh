#!/usr/bin/env bash
# Download, on a machine with a package registry, the wheels a GPU host without one needs to run
# packaging/gpu_check.sh with its own CUDA torch (--python python3 --wheels DIR). Pure-Python wheels only, so
# they install on any Python 3 there; the host's image must already have torch (CUDA), numpy, scipy,
# safetensors, einops, psutil, nvidia-ml-py, scikit-image and pytest.
#
#   bash packaging/gpu_wheels.sh [DIR]        # default .whl (git-ignored); about 5 MB
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-.whl}"
mkdir -p "$DIR"
PY="${PYTHON:-python3}"
# What the engine imports on the GPU check's paths that such an image lacks (versions as pinned/tested here).
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$DIR" \
  monai==1.6.1 nibabel==5.4.2 pydicom==3.0.2 platformdirs==4.14.9
ls -l "$DIR"
du -sh "$DIR"
