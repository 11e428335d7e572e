#!/usr/bin/env bash
# The whole test suite, as CI runs it: set up, lint, check the import rule and the types, run pytest under Xvfb.
set -euo pipefail
cd "$(dirname "$0")/.."
bash packaging/setup.sh
echo "== ruff (set-up took ${SECONDS} s)"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
echo "== import rule (engine never imports Qt, pyvista, VTK or app)"
.venv/bin/lint-imports
echo "== import circles (none in app or engine, TYPE_CHECKING imports counted)"
.venv/bin/python packaging/import_cycles.py
echo "== types (mypy; the checked files are [tool.mypy] files in pyproject.toml)"
.venv/bin/mypy
echo "== pytest (set-up and checks took ${SECONDS} s)"
export QT_QPA_PLATFORM=xcb
# Two processes (pytest-xdist), a file's tests kept together so its module fixtures are built once; each worker
# gets an X display of its own (tests/conftest.py). VOLSYNTH_TEST_WORKERS=0 runs everything in one process.
exec xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python -m pytest \
  -n "${VOLSYNTH_TEST_WORKERS:-2}" --dist loadfile --durations=30 "$@"
