"""Opt-in (``PADDLEOCR_SRC=/path/to/PaddleOCR``): PaddleOCR's own, unmodified ``tools/train.py -c
configs/det/det_mv3_db.yml`` for 36 steps at O1 and O2 (Adam lr 0.01, random init, 160 px, batch 4, Paddle
GradScaler from 1024 with dynamic scaling, 144 synthetic text images), float16 emulated on the CPU:

* native (only ``ampsafe.paddle.amp_emulation.install()``): Paddle's scaler decays, overflow after overflow;
* ``ampsafe run --emulate-fp16`` (default options, ``--on-floor heal``): heals, ends at a scale of >= 256;
* ``ampsafe swap-neck configs/det/det_mv3_db.yml -o safe.yml`` (the safe neck, and ``exp`` on the config's
  ``amp_custom_black_list`` for DBHead's step function at O2) under ``ampsafe run --emulate-fp16``: no overflow.

The harness (dataset, the imgaug / step-log shim, the command lines) is ``bench/ppocr_optin.py``; each run takes
a few minutes on two cores. Needs PaddleOCR's runtime packages (scikit-image, imgaug, lmdb, rapidfuzz).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

SRC = os.environ.get("PADDLEOCR_SRC")
# what PaddleOCR's tools/train.py imports at start-up beyond ampsafe's own requirements (import name: package)
_PPOCR_IMPORTS = {
    "skimage": "scikit-image",
    "imgaug": "imgaug",
    "lmdb": "lmdb",
    "rapidfuzz": "rapidfuzz",
    "pyclipper": "pyclipper",
    "shapely": "shapely",
    "cv2": "opencv-python",
}
_MISSING = [pkg for mod, pkg in _PPOCR_IMPORTS.items() if importlib.util.find_spec(mod) is None]
pytestmark = [
    pytest.mark.skipif(not SRC, reason="set PADDLEOCR_SRC to a PaddleOCR source checkout to run"),
    pytest.mark.skipif(
        bool(SRC and _MISSING),
        reason=f"PaddleOCR's runtime packages are missing: {', '.join(_MISSING)} "
        "(`make test-ppocr PADDLEOCR_SRC=...` installs that tree's requirements.txt into the venv)",
    ),
    pytest.mark.slow,
]

from bench.ppocr_optin import BATCH, STEPS  # noqa: E402  (one epoch of STEPS * BATCH images)

_results: dict = {}


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    if not (Path(SRC) / "tools" / "train.py").is_file() or not (Path(SRC) / "configs/det/det_mv3_db.yml").is_file():
        pytest.fail(f"PADDLEOCR_SRC={SRC} is not a PaddleOCR checkout (no tools/train.py, configs/det/det_mv3_db.yml)")
    from bench.ppocr_optin import write_dataset

    root = tmp_path_factory.mktemp("ppocr-optin")
    write_dataset(root / "data", count=STEPS * BATCH, size=160)
    return root


def _run(work: Path, run: str, level: str) -> dict:
    from bench.ppocr_optin import run_one

    key = (run, level)
    if key not in _results:
        _results[key] = run_one(Path(SRC), work, run, level, data=work / "data")
    result = _results[key]
    assert result["returncode"] == 0, result["log_tail"]
    assert result["steps"] == STEPS, result["log_tail"]
    # the step log's loss is the one PaddleOCR printed (log_smooth_window=1)
    for step in result["per_step"]:
        if step["log_loss"] is not None and step["loss"] == step["loss"]:
            assert step["loss"] == pytest.approx(step["log_loss"], rel=1e-5, abs=1e-5)
    return result


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_native_paddle_scaler_decays(work, level):
    r = _run(work, "native", level)
    assert r["scaler_class"] == "paddle.amp.grad_scaler.GradScaler"
    assert r["overflowing_steps"] >= 10, r["overflow_at"]
    assert r["final_scale"] < 1e-2, (r["final_scale"], r["overflow_at"])


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_ampsafe_run_heals(work, level):
    r = _run(work, "ampsafe", level)
    assert r["scaler_class"].startswith("ampsafe."), r["scaler_class"]
    assert r["heals"] >= 1, r["log_tail"]
    assert r["final_scale"] >= 256, (r["final_scale"], r["overflow_at"])


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_swapped_config_does_not_overflow(work, level):
    r = _run(work, "swapped", level)
    assert r["scaler_class"].startswith("ampsafe."), r["scaler_class"]
    assert r["overflowing_steps"] == 0, r["overflow_at"]
