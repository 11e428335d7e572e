#!/usr/bin/env bash
# Build the offline installable folder dist/volsynth-studio/ with PyInstaller, then smoke-test it:
# the CLI lists and runs the shipped model, and the app starts, generates and takes a screenshot under Xvfb.
set -euo pipefail
cd "$(dirname "$0")/.."
bash packaging/setup.sh
.venv/bin/python -m pip install -q -e ".[packaging]" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/pyinstaller --noconfirm --clean --log-level WARN --distpath dist --workpath build/pyinstaller \
  packaging/volsynth.spec
bash packaging/smoke_test.sh dist/volsynth-studio
