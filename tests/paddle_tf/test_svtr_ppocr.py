"""PaddleOCR's SVTR recognizers built by ppocr's own ``build_model`` (the unmodified tree in
``shared/upstream/PaddleOCR-src``, or ``$PADDLEOCR_SRC``).

* ``rec_svtrnet.yml``'s architecture: STN_ON, ``SVTRNet`` (Local mixers add a ``-inf`` buffer to their logits before
  the softmax; Global mixers attend everywhere), CTCHead;
* PP-OCRv3's ``en_PP-OCRv3_rec.yml``: ``MobileNetV1Enhance`` and the CTC branch of its ``MultiHead``, the
  ``EncoderWithSVTR`` neck (``SequenceEncoder(encoder_type="svtr")``) and CTCHead, as the config sets them.

For each: no risky path at init, a clean emulated float16 step (O1 and O2) under ``ampsafe.watch`` with ppocr's own
CTCLoss, and ``ampsafe.patch(policy="island")`` exact in float32 with the state_dict keys unchanged.

The matmul half, on two more attention recognizers (their scans only):

* PP-OCRv4's ``ch_PP-OCRv4_rec.yml``: ``PPLCNetV3`` and the CTC branch of its ``MultiHead`` (the SVTR neck,
  ``EncoderWithSVTR``, and CTCHead), as for PP-OCRv3;
* ``rec_mtb_nrtr.yml`` (NRTR): ``MTB`` and ppocr's ``Transformer`` head (6 post-norm encoder and 6 decoder
  layers, the class PP-OCRv4's ``MultiHead`` trains as its NRTR branch): teacher forcing, each decoder
  self-attention adding ``generate_square_subsequent_mask``'s ``-inf`` to its logits before the softmax.

Both in training mode, as they train (at random init an eval forward of PP-OCRv4 runs its BatchNorms on the
initial running statistics and really leaves float16's range: 1e8-1e10 in the backbone and neck).

Neither mask nor softmax is a risk (no path is risky at init); the unnormalized matmul paths are reported with
their headroom as the convs' are: each attention's logits matmul and the logits projection that ends the model
with no norm after it (NRTR's ``tgt_word_prj``, PP-OCRv4's ``ctc_head.fc``). Grown (weights scaled as training can
grow them), the projection is the one risky path, and a decoder self-attention's logits past 65504 are risky even
with the ``-inf`` mask in the same add.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest

CLASSES = 37  # the configs' default character set (0-9, a-z) plus CTC's blank
CONFIGS = {
    "svtrnet": "configs/rec/rec_svtrnet.yml",
    "ppocrv3": "configs/rec/PP-OCRv3/en_PP-OCRv3_rec.yml",
    "ppocrv4": "configs/rec/PP-OCRv4/ch_PP-OCRv4_rec.yml",
    "nrtr": "configs/rec/rec_mtb_nrtr.yml",
}
SHAPES = {"svtrnet": [2, 3, 64, 256], "ppocrv3": [2, 3, 48, 320], "ppocrv4": [2, 3, 48, 160], "nrtr": [2, 1, 32, 100]}
NRTR_CLASSES = CLASSES + 3  # NRTRLabelDecode adds <blank>, <s>, </s>
NRTR_LABEL = 27  # max_text_length 25 plus <s> and </s>


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
    """The config's Architecture; PP-OCRv3's / PP-OCRv4's CTC branch of MultiHead as a Neck + Head (their SAR /
    NRTR branch needs labels)."""
    import yaml

    arch = yaml.safe_load((src / CONFIGS[name]).read_text(encoding="utf-8"))["Architecture"]
    if name in ("svtrnet", "nrtr"):
        arch["Head"]["out_channels"] = NRTR_CLASSES if name == "nrtr" else CLASSES
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


# ------------------------------------------------------------------------------------------------ the matmul half
LOGITS = {"ppocrv4": "head.fc", "nrtr": "head.tgt_word_prj"}  # the projection that ends each model, no norm after
NRTR_SELF_ATTN = "head.decoder.0.self_attn"  # its logits get the causal mask's -inf before the softmax


def _inputs(name: str) -> tuple:
    """The scan's inputs: the images; NRTR also its targets (teacher forcing, as ppocr's
    ``Transformer.forward`` reads them: labels, lengths)."""
    import paddle

    if name != "nrtr":
        return (_batch(name)[0],)
    paddle.seed(1)
    images = paddle.rand(SHAPES[name])
    labels = paddle.randint(3, NRTR_CLASSES, [SHAPES[name][0], NRTR_LABEL])
    return images, [labels, paddle.to_tensor([5, 9], dtype="int64")]


def _scan(ppocr, name: str, grow: dict | None = None):
    """``ampsafe.scan`` of the model in training mode (as it trains: batch statistics; CTCHead returns its logits
    and NRTR decodes with teacher forcing), after scaling the weights ``grow`` names."""
    import paddle

    import ampsafe

    model = _build(ppocr, name, "train")
    layers = dict(model.named_sublayers())
    with paddle.no_grad():
        for path, factor in (grow or {}).items():
            layers[path].weight.set_value(layers[path].weight * factor)
    return model, ampsafe.scan(model, _inputs(name))


@pytest.mark.parametrize("name", ["ppocrv4", "nrtr"])
def test_attention_recognizers_masks_and_softmax_are_no_risk(ppocr, name):
    model, report = _scan(ppocr, name)
    if name == "ppocrv4":
        assert type(model.neck.encoder).__name__ == "EncoderWithSVTR"
    else:  # the decoder's self-attention adds the causal mask's -inf to its logits, before the softmax
        assert type(model.head).__name__ == "Transformer" and model.training
        attn = report.path(NRTR_SELF_ATTN)
        assert attn.start_op == "matmul" and any(op.endswith(":softmax") for op in attn.ops), attn.ops
        assert 0 < attn.amax < 1e3, attn  # the -inf lanes are what the mask meant: not measured
    attention = [p for p in report.paths if any(op.endswith(":softmax") for op in p.ops)]
    assert attention, "no attention path recorded"
    assert report.risky == [] and report.risky_ops == [], report.to_markdown()


@pytest.mark.parametrize("name", ["ppocrv4", "nrtr"])
def test_unnormalized_matmul_paths_are_reported_with_their_headroom(ppocr, name):
    _, report = _scan(ppocr, name)
    logits = report.path(LOGITS[name])
    # the logits projection: a matmul path with no norm after it, to the model's output, its headroom measured
    assert logits.start_op in ("linear", "matmul") and not logits.normalized and logits.ends == ("<output>",)
    assert logits.amax > 0 and 8 < logits.headroom_bits < 20 and not logits.risky, logits
    # each attention's logits matmul: reported like a conv's path, with its headroom
    matmuls = [p for p in report.paths if p.start_op == "matmul" and any(op.endswith(":softmax") for op in p.ops)]
    assert matmuls and all(p.headroom_bits is not None and p.headroom_bits > 4 for p in matmuls), matmuls


def test_a_grown_logits_projection_is_the_one_risky_path(ppocr):
    # the projection's weights 2**16 times larger (its init amax ~3.4: past 65504), everything else as built
    _, report = _scan(ppocr, "nrtr", {LOGITS["nrtr"]: 2.0**16})
    risky = [p for p in report.paths if p.risky]
    assert [p.start for p in risky] == [LOGITS["nrtr"]], report.to_markdown()
    assert risky[0].amax > 65504 and risky[0].headroom_bits < 0 and risky[0].overflows_in == "forward"


def test_a_real_logits_overflow_is_not_hidden_by_the_causal_mask(ppocr):
    # the first decoder self-attention's fused qkv 64 times larger: its logits (q.k) 4096 times, past 65504, in
    # the same add as the -inf mask; the mask lanes stay exempt, the real overflow is reported at its matmul
    _, report = _scan(ppocr, "nrtr", {f"{NRTR_SELF_ATTN}.qkv": 64.0})
    attn = report.path(NRTR_SELF_ATTN)
    assert attn.risky and 65504 < attn.amax < 1e30, attn
    assert all(p.start.startswith(NRTR_SELF_ATTN) for p in report.paths if p.risky), report.risky
