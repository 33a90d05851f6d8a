#!/usr/bin/env bash
# An environment where PaddleOCR's kie configs build (they import paddlenlp), and the PaddleOCR zoo's kie rows run
# from it: `bash bench/kie_env.sh [VENV_DIR] -- ARGS` runs `python -m bench.zoo_ppocr ARGS` there, e.g.
#   bash bench/kie_env.sh /work/kie-venv -- --pass scan --only kie/ --redo
#
# paddlenlp 2.8.1's own requirements would move packages the project pins (onnx 1.23 -> 1.17, dill, multiprocess),
# and it imports huggingface_hub's `repo_type_and_id_from_hf_id`, which the project's huggingface_hub 2.x no longer
# has (HF datasets 5.x, which paddlenlp imports too, needs that 2.x). So this builds a venv that reads the project's
# .venv after its own site-packages and holds, without their dependencies, paddlenlp and only what its import needs
# beyond the project's packages: huggingface_hub 0.36 and HF datasets 3.6 (the pair it imports), aistudio-sdk 0.2.6
# (0.3.x dropped `hub.download`), the small packages it imports at start-up, and yacs (LayoutLMv2's visual backbone).
# Needs `make` to have built .venv (or PROJECT_VENV naming the project venv). VENV_DIR defaults to .venv-kie.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=.venv-kie
if [ $# -gt 0 ] && [ "$1" != "--" ]; then VENV=$1; shift; fi
[ "${1:-}" = "--" ] && shift
PROJECT_VENV=${PROJECT_VENV:-.venv}
BASE=$("$PROJECT_VENV/bin/python" -c 'import sys; print(sys.base_prefix)')/bin/python3
SITE=$("$PROJECT_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ ! -x "$VENV/bin/python" ]; then
    "$BASE" -m venv "$VENV"
    echo "$SITE" > "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_project_venv.pth"
    "$VENV/bin/python" -m pip install -q --no-deps "paddlenlp==2.8.1" "huggingface_hub==0.36.2" "datasets==3.6.0" \
        "aistudio-sdk==0.2.6" "colorlog==6.12.0" "jieba==0.42.1" "sentencepiece==0.2.3" "seqeval==1.2.2" \
        "fastapi==0.165.0" "starlette==1.10.0" "opentelemetry-api==1.45.3" "yacs==0.1.8"
fi
"$VENV/bin/python" -c "from paddlenlp.transformers import LayoutXLMModel, LayoutLMModel, LayoutLMv2Model"
PYTHONPATH="$ROOT:$ROOT/lab${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} \
    exec nice -n 10 "$VENV/bin/python" -m bench.zoo_ppocr "$@"
