#!/usr/bin/env bash
# The whole test suite, as CI runs it: set up, lint, check the import rule and the types, run pytest under Xvfb.
set -euo pipefail
cd "$(dirname "$0")/.."
bash packaging/setup.sh
echo "== ruff (set-up took ${SECONDS} s)"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
# The import rule (engine never imports Qt, pyvista, VTK or app), the import circles (none in app or engine,
# TYPE_CHECKING imports counted) and the types (mypy; the checked files are [tool.mypy] files in pyproject.toml)
# run beside pytest, on the time its two processes leave idle; their output follows pytest's, and either failing
# fails the command.
checks_log="$(mktemp)"
(
  set +e
  echo "== import rule (engine never imports Qt, pyvista, VTK or app)"
  .venv/bin/lint-imports && \
    echo "== import circles (none in app or engine, TYPE_CHECKING imports counted)" && \
    .venv/bin/python packaging/import_cycles.py && \
    echo "== types (mypy; the checked files are [tool.mypy] files in pyproject.toml)" && \
    .venv/bin/mypy
) > "$checks_log" 2>&1 &
checks_pid=$!
echo "== pytest (set-up and ruff took ${SECONDS} s; the import rule, import circles and types run beside it)"
export QT_QPA_PLATFORM=xcb
# Two processes (pytest-xdist), a file's tests kept together so its module fixtures are built once; each worker
# gets an X display of its own (tests/conftest.py). VOLSYNTH_TEST_WORKERS=0 runs everything in one process.
pytest_status=0
xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python -m pytest \
  -n "${VOLSYNTH_TEST_WORKERS:-2}" --dist loadfile --durations=30 "$@" || pytest_status=$?
checks_status=0
wait "$checks_pid" || checks_status=$?
cat "$checks_log"
rm -f "$checks_log"
[ "$checks_status" -eq 0 ] || echo "== the import rule, import circles or types FAILED (above)"
echo "== done in ${SECONDS} s"
[ "$pytest_status" -eq 0 ] && [ "$checks_status" -eq 0 ]
