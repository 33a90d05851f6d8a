"""PaddleOCR's SVTR recognizers built by ppocr's own ``build_model`` (the unmodified tree in
``shared/upstream/PaddleOCR-src``, or ``$PADDLEOCR_SRC``).

* ``rec_svtrnet.yml``'s architecture: STN_ON, ``SVTRNet`` (Local mixers add a ``-inf`` buffer to their logits before
  the softmax; Global mixers attend everywhere), CTCHead;
* PP-OCRv3's ``en_PP-OCRv3_rec.yml``: ``MobileNetV1Enhance`` and the CTC branch of its ``MultiHead``, the
  ``EncoderWithSVTR`` neck (``SequenceEncoder(encoder_type="svtr")``) and CTCHead, as the config sets them.

For each: no risky path at init, a clean emulated float16 step (O1 and O2) under ``ampsafe.watch`` with ppocr's own
CTCLoss, and ``ampsafe.patch(policy="island")`` exact in float32 with the state_dict keys unchanged.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

CLASSES = 37  # the configs' default character set (0-9, a-z) plus CTC's blank
CONFIGS = {"svtrnet": "configs/rec/rec_svtrnet.yml", "ppocrv3": "configs/rec/PP-OCRv3/en_PP-OCRv3_rec.yml"}
SHAPES = {"svtrnet": [2, 3, 64, 256], "ppocrv3": [2, 3, 48, 320]}


@pytest.fixture(scope="module")
def ppocr(paddleocr_src):
    sys.path.insert(0, str(paddleocr_src))
    try:
        from ppocr.losses import build_loss
        from ppocr.modeling.architectures import build_model

        yield build_model, build_loss, paddleocr_src
    finally:
        sys.path.remove(str(paddleocr_src))


def _architecture(src: Path, name: str) -> dict:
    """The config's Architecture; PP-OCRv3's CTC branch of MultiHead as a Neck + Head (its SAR branch needs labels)."""
    import yaml

    arch = yaml.safe_load((src / CONFIGS[name]).read_text(encoding="utf-8"))["Architecture"]
    if name == "svtrnet":
        arch["Head"]["out_channels"] = CLASSES
        return arch
    ctc = next(h["CTCHead"] for h in arch["Head"]["head_list"] if "CTCHead" in h)
    neck = dict(ctc["Neck"])
    assert neck.pop("name") == "svtr"
    arch["Neck"] = {"name": "SequenceEncoder", "encoder_type": "svtr", **neck}
    arch["Head"] = {"name": "CTCHead", "out_channels": CLASSES, **ctc["Head"]}
    return arch


def _build(ppocr, name: str, mode: str):
    import paddle

    build_model, _, src = ppocr
    paddle.seed(0)
    model = build_model(copy.deepcopy(_architecture(src, name)))
    getattr(model, mode)()
    return model


def _batch(name: str):
    import paddle

    paddle.seed(1)
    images = paddle.rand(SHAPES[name])
    labels = paddle.randint(1, CLASSES, [SHAPES[name][0], 25])
    lengths = paddle.to_tensor([5, 9], dtype="int64")
    return images, labels, lengths


def test_the_models_are_ppocrs_svtr(ppocr):
    svtr = _build(ppocr, "svtrnet", "eval")
    assert type(svtr.backbone).__name__ == "SVTRNet"
    assert any(type(m).__name__ == "Attention" and getattr(m, "mixer", "") == "Local" for m in svtr.sublayers())
    v3 = _build(ppocr, "ppocrv3", "eval")
    assert type(v3.neck.encoder).__name__ == "EncoderWithSVTR"


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name", ["svtrnet", "ppocrv3"])
def test_svtr_has_no_risky_path_at_init(ppocr, name, mode):
    import ampsafe

    model = _build(ppocr, name, mode)
    images, _, _ = _batch(name)
    report = ampsafe.scan(model, (images,))
    attention = [p for p in report.paths if "softmax" in " ".join(p.ops)]
    assert attention, "no attention path recorded"
    assert report.risky == [] and report.risky_ops == [], report.to_markdown()


@pytest.mark.parametrize("level", ["O1", "O2"])
@pytest.mark.parametrize("name", ["svtrnet", "ppocrv3"])
def test_svtr_emulated_float16_step_is_clean_under_watch(ppocr, name, level):
    import paddle

    import ampsafe
    from ampsafe.paddle import emulate_fp16

    _, build_loss, _ = ppocr
    model = _build(ppocr, name, "train")
    loss_fn = build_loss({"name": "CTCLoss"})
    images, labels, lengths = _batch(name)
    with ampsafe.watch(model) as w, emulate_fp16(model, level=level) as emu:
        out = model(images)
        loss = loss_fn(out, [images, labels, lengths])["loss"]
        loss.backward()
    assert w.events == []
    assert bool(paddle.isfinite(loss)) and "softmax" in emu.fp32_ops | emu.emulated
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(bool(paddle.isfinite(g).all()) for g in grads)


@pytest.mark.parametrize("name", ["svtrnet", "ppocrv3"])
def test_svtr_island_is_exact_in_fp32_and_keeps_keys(ppocr, name):
    import numpy as np

    import ampsafe

    model = _build(ppocr, name, "eval")
    images, _, _ = _batch(name)
    reference = model(images).numpy()
    keys = list(model.state_dict())
    patched = ampsafe.patch(model, (images,), policy="island")
    assert any("mixer" in p for p in patched.patched), patched.patched
    assert np.abs(model(images).numpy() - reference).max() == 0.0
    assert list(model.state_dict()) == keys
