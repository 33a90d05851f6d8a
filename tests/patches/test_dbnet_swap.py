"""Swapped PaddleOCR configs build with this project's dbnet builder, and train without float16 overflow."""

from __future__ import annotations

import paddle
import pytest

import ampsafe_lab.workloads as workloads
from ampsafe.patches import swap_neck
from ampsafe.patches.paddleocr_necks import AmpSafeDBFPN

# config -> the neck class its rewrite must build (PP-OCRv3's student: RSEFPN on MobileNetV3 without SE)
DB_CONFIGS = {
    "PaddleOCR/configs/det/det_mv3_db.yml": "AmpSafeDBFPN",
    "PaddleOCR/configs/det/ch_ppocr_v2.0/ch_det_mv3_db_v2.0.yml": "AmpSafeDBFPN",
    "PaddleOCR/configs/det/det_r50_vd_db.yml": "AmpSafeDBFPN",
    "PaddleOCR/configs/det/det_res18_db_v2.0.yml": "AmpSafeDBFPN",
    "PaddleOCR/configs/det/ch_PP-OCRv3/ch_PP-OCRv3_det_student.yml": "AmpSafeRSEFPN",
}


def test_dbnet_builder_builds_every_patches_neck_with_nothing_registered():
    from ampsafe.patches.register import paddleocr_classes
    from ampsafe_lab.nets.paddle import dbnet as builder

    before = dict(builder.NECKS)
    necks = builder._necks()
    assert builder.NECKS == before == {"DBFPN": builder.DBFPN}  # looked up, not registered into the builder
    assert necks["AmpSafeDBFPN"] is AmpSafeDBFPN
    assert {"AmpSafeRSEFPN", "AmpSafeLKPAN", "RSEFPN", "LKPAN"} <= set(necks)
    assert all(necks[name] is cls for name, cls in paddleocr_classes().items())  # every neck ampsafe.patches has


@pytest.mark.parametrize("rel", sorted(DB_CONFIGS))
def test_swapped_db_config_builds_with_the_dbnet_builder(upstream, tmp_path, rel):
    original = workloads.build("dbnet", config=upstream / rel, image_size=64, batch_size=1)
    swapped = workloads.build(
        "dbnet", config=swap_neck(upstream / rel, out=tmp_path / "s.yml"), image_size=64, batch_size=1
    )
    assert type(swapped.model.neck).__name__ == DB_CONFIGS[rel]
    assert type(swapped.model.neck).__module__ == "ampsafe.paddle.nets.paddleocr_necks"
    up_keys, safe_keys = set(original.model.state_dict()), set(swapped.model.state_dict())
    assert up_keys < safe_keys and all(".neck." in k or k.startswith("neck.") for k in safe_keys - up_keys)
    loss = swapped.loss(swapped.batch(0))
    loss.backward()
    assert bool(paddle.isfinite(loss))


def _overflowing_steps(config, steps: int, lr: float) -> list[int]:
    """High-lr Adam under emulated float16 (O1); a step whose loss or gradients are non-finite is skipped, as a
    GradScaler would, and recorded."""
    from ampsafe.paddle import emulate_fp16

    w = workloads.build("dbnet", seed=0, config=config, image_size=64, batch_size=2)
    optimizer = w.make_optimizer(lr)
    bad = []
    for step in range(steps):
        batch = w.batch(step)
        with emulate_fp16(w.model):
            loss = w.loss(batch)
            loss.backward()
        grads = [p.grad for p in w.model.parameters() if p.grad is not None]
        if bool(paddle.isfinite(loss)) and all(bool(paddle.isfinite(g).all()) for g in grads):
            optimizer.step()
        else:
            bad.append(step)
        optimizer.clear_grad()
    return bad


@pytest.mark.slow
def test_swapped_dbnet_has_no_overflowing_step_where_the_original_overflows(upstream, tmp_path):
    rel = "PaddleOCR/configs/det/det_mv3_db.yml"
    original = _overflowing_steps(upstream / rel, steps=12, lr=0.05)
    swapped = _overflowing_steps(swap_neck(upstream / rel, out=tmp_path / "s.yml"), steps=12, lr=0.05)
    assert original, "the original DBNet should overflow float16 at this learning rate"
    assert swapped == []


def test_paddleocr_checkpoint_loads_into_swapped_model_missing_only_the_new_batchnorms(upstream, tmp_path):
    """PaddleOCR's own det_mv3_db weights (reference/det_mv3_db, produced by ppocr) load into the swapped model."""
    import warnings

    import numpy as np

    reference = np.load(upstream / "PaddleOCR/reference/det_mv3_db/state_dict.npz")
    config = swap_neck(upstream / "PaddleOCR/configs/det/det_mv3_db.yml", out=tmp_path / "s.yml")
    model = workloads.build("dbnet", config=config, image_size=64, batch_size=1).model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # paddle warns once per key it skips
        missing, unexpected = model.set_state_dict({k: paddle.to_tensor(reference[k]) for k in reference.files})
    expected = {
        f"neck.{n}_bn.{p}"
        for n in ("in2", "in3", "in4", "in5", "p2", "p3", "p4", "p5")
        for p in ("weight", "bias", "_mean", "_variance")
    }
    assert set(missing) == expected and not unexpected
    state = model.state_dict()
    assert all(np.array_equal(state[k].numpy(), reference[k]) for k in reference.files)
