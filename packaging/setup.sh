#!/usr/bin/env bash
# Set up a fresh Debian machine (Python 3.11, root) for VolSynth Studio: system libraries for Qt/VTK under
# Xvfb, a virtualenv in .venv, and the project with its dev tools. Safe to run again: it skips what is there.
# `setup.sh --system` installs the system libraries only (packaging/build.sh: the build has its own venv).
set -euo pipefail
cd "$(dirname "$0")/.."
SYSTEM_ONLY=0
[ "${1:-}" = "--system" ] && SYSTEM_ONLY=1

SYSTEM_PACKAGES=(
  xvfb xauth                                   # a virtual X display for the GUI and its tests
  libgl1 libegl1 libglx-mesa0 libgl1-mesa-dri  # OpenGL through Mesa (VTK renders with it)
  libxkbcommon-x11-0 libxcb-cursor0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1 libxcb-randr0
  libxcb-render-util0 libxcb-shape0 libxcb-xinerama0 libxcb-xkb1 libxcb-xfixes0  # Qt's xcb platform plugin
  libxrender1 libxi6 libxt6 libsm6 libice6     # VTK's X11 render window
  libdbus-1-3 libfontconfig1 fonts-dejavu-core # Qt runtime and a readable font
  dicom3tools                                  # dciodvfy: the tests check exported DICOM against the IODs
)

missing=()
for pkg in "${SYSTEM_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing system packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ "$SYSTEM_ONLY" -eq 1 ]; then
  echo "setup: system libraries ready"
  exit 0
fi

PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $("$PYTHON" --version)"
  "$PYTHON" -m venv .venv
fi
# The torch pin (2.13.0) is in pyproject.toml; pip takes it from the configured index (PyPI's Linux x86_64
# wheel is the CUDA build; PyTorch's https://download.pytorch.org/whl/cpu index has the CPU-only one).
if ! .venv/bin/python -c "import engine, app, pytest" 2>/dev/null \
   || [ pyproject.toml -nt .venv/.volsynth-installed ]; then
  echo "setup: installing Python packages (first run takes a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -m pip install -q -e ".[dev,cohort,xla,torchao]" 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import engine, app, torch, monai, PySide6, pyvista, jax, libtpu, mypy" # fail loudly if anything is missing
  touch .venv/.volsynth-installed
fi
echo "setup: ready ($(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
