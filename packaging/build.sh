#!/usr/bin/env bash
# Build the offline installable folder dist/volsynth-studio/ with PyInstaller, then smoke-test it: the CLI
# generates (anatomy check, tissue maps), segments, reports quality, gets models offline and uses the vault,
# and the app starts, generates and takes a screenshot under Xvfb.
#
# PyInstaller runs from .venv-build, which holds only the product's run-time requirements and PyInstaller
# (`pip install .[packaging]`), never the development, test or type-checking tools of .venv: what the build
# environment holds can change what ships (mypy there once broke the frozen 3D view). The build stops if
# .venv-build holds anything else (packaging/frozen_contents.py check-env), after recreating it once.
set -euo pipefail
cd "$(dirname "$0")/.."
bash packaging/setup.sh --system  # Xvfb, Mesa and Qt's xcb libraries: the smoke test runs the app
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null || PYTHON=python3
BUILD_ENV=.venv-build

quiet_pip() {  # pip's own exit status, without its noise about script locations
  "$BUILD_ENV/bin/python" -m pip "$@" 2>&1 | { grep -v "^WARNING: Location" || true; }
}

make_build_env() {
  rm -rf "$BUILD_ENV"
  echo "build: creating $BUILD_ENV with $("$PYTHON" --version) (run-time requirements and PyInstaller only)"
  "$PYTHON" -m venv "$BUILD_ENV"
  quiet_pip install -q --upgrade pip
}

[ -x "$BUILD_ENV/bin/python" ] || make_build_env
# Not editable: the product installed as a user's pip would install it, with its dependencies as pinned now.
quiet_pip install -q ".[packaging]"
if ! "$BUILD_ENV/bin/python" packaging/frozen_contents.py check-env; then
  make_build_env  # a package left over from an older pyproject.toml, or one installed by hand
  quiet_pip install -q ".[packaging]"
  "$BUILD_ENV/bin/python" packaging/frozen_contents.py check-env
fi
"$BUILD_ENV/bin/pyinstaller" --noconfirm --clean --log-level WARN --distpath dist --workpath build/pyinstaller \
  packaging/volsynth.spec
bash packaging/smoke_test.sh dist/volsynth-studio
