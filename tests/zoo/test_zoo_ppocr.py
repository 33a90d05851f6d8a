"""The CI subset of the PaddleOCR zoo (``bench/zoo_ppocr.py``): one config per neck family of the unmodified tree
(``shared/upstream/PaddleOCR-src``, or ``$PADDLEOCR_SRC``), built by the tree's own ``tools/train.py`` (its main,
stopped at ``build_model``) and scanned at O1 and O2; and a few steps of ``tools/train.py`` itself under
``ampsafe run --emulate-fp16``, read from the run's ``report.json``.

What the scans assert is what they measure: every conv/matmul of the neck starts a path with a finite headroom;
a neck with a safe variant in patches/registry.py shows unnormalized neck paths, and the unnormalized neck conv
with the least headroom, grown until its output nears 65504 (a stand-in for weights grown in training), has its
path flagged risky, having lost no more bits than it grew; O2 sees float16 ops that O1 keeps in float32
(DBHead's ``exp``).
"""

from __future__ import annotations

import math

import pytest

SIDE = {"SASTFPN": 128}  # det / e2e page side: 64, where the neck's upsampling allows it
NECKS = {  # neck class -> the cheapest config of the tree that builds it
    "DBFPN": "det/det_mv3_db.yml",
    "RSEFPN": "det/ch_PP-OCRv3/ch_PP-OCRv3_det_student.yml",
    "EASTFPN": "det/det_mv3_east.yml",
    "CTFPN": "det/det_r18_vd_ct.yml",
    "SequenceEncoder": "rec/rec_mv3_none_bilstm_ctc.yml",
}
SLOW_NECKS = {  # larger backbones: over 5 s each on one core (FCEFPN and PGFPN: in bench/zoo_ppocr.py only)
    "LKPAN": "det/ch_PP-OCRv4/ch_PP-OCRv4_det_teacher.yml",
    "SASTFPN": "det/det_r50_vd_sast_icdar15.yml",
}


def _input(config: dict, rel: str, neck: str):
    import numpy as np
    import paddle

    from bench.zoo_ppocr import input_shape

    family = rel.split("/")[0]
    side = SIDE.get(neck, 64)
    shape = (3, side, side) if family in ("det", "e2e") else input_shape(config, family)
    return paddle.to_tensor(np.random.default_rng(0).uniform(-1, 1, (2, *shape)).astype("float32"))


def _neck_convs(model) -> set[str]:
    import paddle

    kinds = (paddle.nn.Conv2D, paddle.nn.Linear, paddle.nn.Conv2DTranspose, paddle.nn.LSTM, paddle.nn.GRU)
    return {f"neck.{n}" for n, m in model.neck.named_sublayers() if isinstance(m, kinds)}


def _output_amax(model, layer, x) -> float:
    """The largest magnitude of ``layer``'s output in one float32 forward of ``model`` on ``x``."""
    import paddle

    seen = []
    hook = layer.register_forward_post_hook(lambda _layer, _inputs, out: seen.append(float(out.abs().max())))
    try:
        with paddle.no_grad():
            model(x)
    finally:
        hook.remove()
    return max(seen)


_scanned: dict = {}


def _scan_neck(paddleocr_src, neck: str, rel: str):
    if neck not in _scanned:
        _scanned[neck] = _measure_neck(paddleocr_src, neck, rel)
    return _scanned[neck]


def _measure_neck(paddleocr_src, neck: str, rel: str):
    import paddle

    import ampsafe
    from ampsafe.patches import registry
    from bench.zoo_ppocr import build

    paddle.seed(0)  # the random init each neck is measured at
    model, config, _ = build(paddleocr_src, rel)
    assert type(model.neck).__name__ == neck
    x = _input(config, rel, neck)
    model.train()
    reports = {level: ampsafe.scan(model, (x,), level=level) for level in ("O1", "O2")}
    o1 = reports["O1"]
    starts = {p.start: p for p in o1.paths}
    convs = _neck_convs(model)
    # the scan covers the neck: every conv/matmul there starts a path, with a measured, finite headroom
    assert convs and convs <= set(starts), sorted(convs - set(starts))
    for name in convs:
        bits = starts[name].headroom_bits
        assert bits is not None and math.isfinite(bits) and 0 < bits < 40, (name, bits)
    unnormalized = {p.start for p in o1.paths if p.start in convs and not p.normalized}
    if registry.safe_neck(registry.PADDLEOCR, neck):
        section = config["Architecture"]["Neck"]
        if registry.setting_safe_reason(registry.PADDLEOCR, neck, section):  # e.g. a BiLSTM SequenceEncoder
            assert not unnormalized, (section, sorted(unnormalized))
        else:  # a safe variant exists because the neck has such convs
            assert unnormalized, sorted(convs)
    # O2 puts in float16 what O1 keeps in float32: never fewer low-precision risky ops
    assert len(reports["O2"].risky_ops) >= len(o1.risky_ops)
    if unnormalized:
        # the unnormalized neck conv with the least headroom, its weights grown (a stand-in for weights grown in
        # training) until its own output is within 2 bits of 65504: the scan flags its path as risky. The growth is
        # set from the conv's own output, since the path's peak may lie downstream (an SE block, a concat) where
        # other branches keep it larger than the conv's output.
        name = min(unnormalized, key=lambda n: starts[n].headroom_bits)
        layer = dict(model.named_sublayers())[name]
        growth = math.floor(math.log2(65504.0 / _output_amax(model, layer, x))) - 2
        with paddle.no_grad():
            layer.weight.set_value(layer.weight * 2.0**growth)
        grown = {p.start: p for p in ampsafe.scan(model, (x,), level="O1").paths}[name]
        lost = starts[name].headroom_bits - grown.headroom_bits
        # a positively homogeneous path loses at most the growth; what lies past it keeps the loss above 0
        assert grown.risky and grown.headroom_bits < 4 and 0 < lost < growth + 1, (name, starts[name], grown)
    return reports


@pytest.mark.parametrize("neck", sorted(NECKS))
def test_neck_family_scans_at_O1_and_O2(paddleocr_src, neck):
    _scan_neck(paddleocr_src, neck, NECKS[neck])


@pytest.mark.slow
@pytest.mark.parametrize("neck", sorted(SLOW_NECKS))
def test_neck_family_scans_at_O1_and_O2_large_backbones(paddleocr_src, neck):
    _scan_neck(paddleocr_src, neck, SLOW_NECKS[neck])


def test_dbheads_exp_is_float16_at_O2_only(paddleocr_src):
    """DBHead's step function ``1 / (1 + exp(-k (P - T)))``: Paddle's O1 keeps ``exp`` in float32, O2 does not;
    at random init its input already leaves float16's range."""
    reports = _scan_neck(paddleocr_src, "DBFPN", NECKS["DBFPN"])
    assert not [o for o in reports["O1"].risky_ops if o.op == "exp"]
    (exp,) = [o for o in reports["O2"].risky_ops if o.op == "exp"]
    assert exp.module == "head" and exp.headroom_bits < 0, exp


@pytest.mark.slow
def test_tools_train_under_ampsafe_run_heals_dbheads_exp_at_O2(paddleocr_src, tmp_path):
    """Three steps of ``tools/train.py -c configs/det/det_mv3_db.yml`` (its Adam at lr 0.001, random init, 160 px
    synthetic pages, batch 2) at O2: every step overflows in DBHead's exp (scan above); the run's report.json says heal
    islanded ``head`` within the three steps and the scale is back where it started."""
    from bench import zoo_ppocr
    from tests.run.run_helpers import stepped_scaler

    steps = 3
    rel = NECKS["DBFPN"]
    folder = tmp_path / "run"
    zoo_ppocr.write_data(paddleocr_src, rel, folder / "data", count=steps * zoo_ppocr.BATCH, side=160)
    result = zoo_ppocr.train_one(paddleocr_src, rel, folder, "ampsafe", steps=steps, side=160)
    assert result["returncode"] == 0 and result["steps"] == steps, result["log_tail"]
    scaler = stepped_scaler(folder / "ampsafe" / "report")
    assert scaler.total_steps == steps and scaler.skipped_at and scaler.skipped_at[0] == 0, scaler.steps
    (heal,) = scaler.heal_records
    assert heal.paths == ("head",) and heal.step < steps, heal
    assert scaler.floor_hits == 0 and result["final_scale"] == 1024.0, result["per_step"]
