#!/usr/bin/env bash
# An environment where ModelOpt AutoCast runs on a CPU beside this project's test set, and the tests that apply
# `ampsafe plan --to modelopt` with AutoCast itself (tests/plan/test_modelopt_autocast.py).
#
# nvidia-modelopt[onnx] pins onnx~=1.21 (requirements-dev.txt pins 1.23, which the rest of the suite uses) and asks
# for onnxruntime-gpu; so this builds a venv of the extra's packages (onnx 1.21, onnxruntime's CPU wheel) that
# reads the project's .venv after its own site-packages, and runs the tests there.
# Usage: bash bench/modelopt_env.sh [VENV_DIR]   (default .venv-modelopt; needs `make` to have built .venv)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${1:-.venv-modelopt}
BASE=$(.venv/bin/python -c 'import sys; print(sys.base_prefix)')/bin/python3
SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ ! -x "$VENV/bin/python" ]; then
    "$BASE" -m venv "$VENV"
    echo "$SITE" > "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_project_venv.pth"
    "$VENV/bin/python" -m pip install -q "onnx==1.21.0" "onnx-graphsurgeon==0.6.1" "onnxscript==0.7.2" \
        "polygraphy==0.53.6" "onnxconverter-common~=1.16.0" "onnxslim>=0.1.76" ml_dtypes lief cppimport \
        "onnxruntime~=1.24.2"
fi
PYTHONPATH="$ROOT:$ROOT/lab" "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/plan/test_modelopt_autocast.py
