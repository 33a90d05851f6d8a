#!/usr/bin/env bash
# The torch part of `ampsafe bench --suite full` on a lent CUDA GPU (H200), within 8 minutes. PyTorch only:
# Paddle cannot be carried to that machine. Usage (from anywhere):
#   bash bench/gpu.sh              # the real run: needs torch.cuda.is_available()
#   bash bench/gpu.sh --dry-run    # toy sizes on any device, CPU included: proves the script executes
# Results: gpu-bench.json/.md (gpu-dry-run.* for a dry run) in $OUT/bench/results when $OUT is set (the device
# tool returns files written under $OUT), else in bench/results; the markdown is printed at the end too.
# PYTHON=/path/to/python picks the interpreter (default: the repo's .venv if it has torch, else python3).
set -uo pipefail
cd "$(dirname "$0")/.."

pick_python() {
  for candidate in "${PYTHON:-}" .venv/bin/python python3 python; do
    [ -n "$candidate" ] || continue
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import torch" >/dev/null 2>&1; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}

if ! PY=$(pick_python); then
  echo "gpu.sh: no Python with torch found (tried \$PYTHON, .venv/bin/python, python3, python)" >&2
  exit 2
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # ampsafe and bench from this checkout, installed or not
export PYTHONDONTWRITEBYTECODE=1
echo "gpu.sh: $("$PY" -c 'import sys, torch; print(sys.executable, "torch", torch.__version__, "cuda", torch.cuda.is_available())')"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# 470 s hard stop (8 minutes minus start-up); the script's own budget stops starting new work earlier.
timeout 470 "$PY" bench/gpu_bench.py --budget-s 420 "$@"
status=$?
[ $status -eq 124 ] && echo "gpu.sh: stopped at the 470 s limit; results written so far are kept" >&2
exit $status
