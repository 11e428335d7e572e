#!/usr/bin/env bash
# Every GPU check of VolSynth in one unattended run: python -m benchmarks.gpu_suite, after setting up
# Python for it. Writes to --out: gpu_suite.json (every number), gpu_suite.txt (the table, printed last),
# install.json and gpu_suite_logs.tar.gz; bulky files (models, volumes) go to --work (default OUT/work).
#
#   bash packaging/gpu_check.sh --out build/gpu                 # fresh GPU host with a package registry:
#                                                              #   .venv-gpu + CUDA torch 2.13.0, then the suite
#   bash packaging/gpu_check.sh --python python3 --wheels .whl --out "$OUT"   # a host with no registry whose
#                                                              #   python3 already has a CUDA torch (carried wheels
#                                                              #   for what it lacks, packaging/gpu_wheels.sh)
#   bash packaging/gpu_check.sh --cpu-smoke --python .venv/bin/python --out build/gpu-smoke   # tiny, on a CPU
#
# The suite itself keeps to --budget-s (default 600 s): every part runs in its own process with its own time
# limit. The install is apart from that budget and timed on its own (install.json; the table says how long).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="build/gpu-check"
WORK=""             # bulky files (models, volumes, carried wheels installed); default OUT/work
VENV=".venv-gpu"
PY=""
WHEELS=""
TORCH_INDEX=""       # empty: PyPI, whose torch 2.13.0 Linux x86_64 wheel is the CUDA 13.0 build
SMOKE=""
INSTALL_ONLY=""
SUITE_ARGS=()
usage() { sed -n '2,15p' "$0"; echo "options: --out DIR --work DIR --venv DIR --python PY --wheels DIR --torch-index URL"\
  "--cpu-smoke --install-only --budget-s S --parts a,b --skip-parts a,b"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --work) WORK="$2"; shift 2 ;;
    --venv) VENV="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    --wheels) WHEELS="$2"; shift 2 ;;
    --torch-index) TORCH_INDEX="$2"; shift 2 ;;
    --cpu-smoke) SMOKE="--cpu-smoke"; shift ;;
    --install-only) INSTALL_ONLY=1; shift ;;
    --budget-s|--parts|--skip-parts) SUITE_ARGS+=("$1" "$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_check: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="${WORK:-$OUT/work}"
mkdir -p "$WORK"
WORK="$(cd "$WORK" && pwd)"
install_started=$(date +%s.%N)
install_mode=""

if [ -z "$PY" ]; then
  # A fresh virtualenv with the CUDA build of the pinned torch and no TPU packages (no [xla] extra).
  install_mode="venv"
  BASE="${BASE_PYTHON:-python3.11}"
  command -v "$BASE" >/dev/null || BASE=python3
  if [ ! -x "$VENV/bin/python" ]; then
    echo "gpu_check: creating $VENV with $("$BASE" --version)"
    "$BASE" -m venv "$VENV"
  fi
  PY="$VENV/bin/python"
  if ! "$PY" -c "import torch, engine, monai, pytest; assert torch.version.cuda" 2>/dev/null; then
    echo "gpu_check: installing torch 2.13.0 (CUDA build) and the project into $VENV"
    PIP=("$PY" -m pip install -q --disable-pip-version-check)
    if [ -n "$WHEELS" ]; then
      PIP+=(--no-index --find-links "$WHEELS")   # offline: wheels downloaded beforehand
    fi
    if [ -n "$TORCH_INDEX" ]; then
      # PyTorch's own index names its builds torch-2.13.0+cuXYZ after the URL's last part (.../whl/cu130).
      TORCH_REQ="torch==2.13.0+${TORCH_INDEX##*/}"
      "${PIP[@]}" --index-url "$TORCH_INDEX" "$TORCH_REQ"
    else
      # '===' is exact string equality: '==2.13.0' would also accept a local CPU wheel named 2.13.0+cpu
      # that a pip configuration's find-links may offer first.
      "${PIP[@]}" "torch===2.13.0"
    fi
    "${PIP[@]}" -e ".[dev]"
  fi
else
  # An interpreter that already has a CUDA torch (a GPU host image without a package registry). Only
  # what it lacks is installed, from carried wheels, into a folder of its own put on PYTHONPATH.
  install_mode="python"
  if [ -n "$WHEELS" ] && compgen -G "$WHEELS/*.whl" >/dev/null; then
    SITE="$WORK/site"
    echo "gpu_check: installing carried wheels from $WHEELS into $SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "$WHEELS"/*.whl
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
install_s=$(python3 -c "import time; print(round(time.time() - $install_started, 1))" 2>/dev/null || echo 0)

"$PY" - "$OUT/install.json" "$install_mode" "$install_s" "$WHEELS" "$TORCH_INDEX" <<'EOF'
import json, sys
out, mode, seconds, wheels, index = sys.argv[1:6]
record = {"mode": mode, "seconds": float(seconds), "wheels": wheels or None, "torch_index": index or "PyPI",
          "python": sys.executable, "python_version": sys.version.split()[0]}
try:
    import torch
    record.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
except Exception as exc:  # recorded, and the suite's parts then say what is missing
    record["torch_error"] = f"{type(exc).__name__}: {exc}"
missing = []
for name in ("engine", "monai", "nibabel", "safetensors", "numpy", "psutil", "pynvml", "pytest"):
    try:
        __import__(name)
    except Exception as exc:
        missing.append(f"{name} ({type(exc).__name__}: {exc})")
record["missing_modules"] = missing
json.dump(record, open(out, "w"), indent=2)
print(f"gpu_check: set-up ({mode}) took {record['seconds']:.0f} s; torch {record.get('torch')} "
      f"CUDA {record.get('torch_cuda')}; missing: {', '.join(missing) or 'nothing'}")
EOF
[ -n "$INSTALL_ONLY" ] && exit 0

exec "$PY" -m benchmarks.gpu_suite --out "$OUT" --work "$WORK" --install-record "$OUT/install.json" $SMOKE \
  "${SUITE_ARGS[@]}"
