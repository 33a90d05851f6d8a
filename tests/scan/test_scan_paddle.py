"""ampsafe.scan on Paddle models: a DBFPN-shaped model built here, and the dbnet workload when it exists."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

paddle = pytest.importorskip("paddle")

import numpy as np  # noqa: E402

import ampsafe  # noqa: E402
from ampsafe.scanner import ScanError  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from paddle_models import TinyFPN  # noqa: E402


@pytest.fixture(scope="module")
def tiny():
    paddle.seed(0)
    model = TinyFPN()
    model.train()
    return model, (paddle.randn([2, 3, 32, 32]),)


@pytest.fixture(scope="module")
def tiny_report(tiny):
    model, inputs = tiny
    return ampsafe.scan(model, inputs)


def test_functional_upsample_and_add_between_convs_are_on_the_path(tiny_report):
    in3 = tiny_report.path("in3_conv")
    assert ":interpolate" in in3.ops and ":add" in in3.ops
    # paths branch: in3 feeds p3_conv directly and p2_conv through the upsample + add
    assert set(in3.ends) == {"p3_conv", "p2_conv"} and not in3.normalized
    assert tiny_report.path("in2_conv").ends == ("p2_conv",)
    assert ":concat" in tiny_report.path("p2_conv").ops
    assert set(tiny_report.path("p3_conv").ends) == {"head_conv", "thresh_conv"}


def test_convs_followed_by_batchnorm_are_normalized(tiny_report):
    for start, bn in [("stem.conv", "stem.bn"), ("down.conv", "down.bn"), ("head_conv", "head_bn")]:
        p = tiny_report.path(start)
        assert p.normalized and p.ends == (bn,), p


def test_squeeze_excitation_is_unnormalized_but_not_risky(tiny_report):
    conv1, conv2 = tiny_report.path("se.conv1"), tiny_report.path("se.conv2")
    assert not conv1.normalized and conv1.ends == ("se.conv2",) and not conv1.risky
    assert conv2.normalized and "se:hardsigmoid" in conv2.ops


def test_o2_step_function_exp_is_a_risky_op_o1_is_not(tiny):
    model, inputs = tiny
    o2 = ampsafe.scan(model, inputs, level="O2")
    exp = [o for o in o2.risky_ops if o.op == "exp"]
    assert exp and exp[0].amax > 65504 and exp[0].headroom_bits < 0
    assert not [o for o in ampsafe.scan(model, inputs, level="O1").risky_ops if o.op == "exp"]


def test_backward_is_measured_without_touching_parameter_gradients(tiny):
    model, inputs = tiny
    report = ampsafe.scan(model, inputs, loss_fn=lambda out: out.mean() * 1e4, loss_scale=2.0**16)
    p = report.path("in2_conv")
    assert p.grad_amax is not None and p.grad_amax > 65504 and p.overflows_in == "backward"
    assert all(q.grad is None for q in model.parameters())
    # gradients a user already has are left as they were
    model(*inputs).mean().backward()
    before = {n: q.grad.numpy().copy() for n, q in model.named_parameters() if q.grad is not None}
    ampsafe.scan(model, inputs, loss_fn=lambda out: out.mean(), loss_scale=2.0**16)
    after = {n: q.grad.numpy() for n, q in model.named_parameters() if q.grad is not None}
    assert before.keys() == after.keys() and before
    for n in before:
        np.testing.assert_array_equal(before[n], after[n], err_msg=n)
    model.clear_gradients(set_to_zero=False)


def _paddle_state(model):
    return {
        "training": [layer.training for layer in [model, *model.sublayers()]],
        "state": {k: v.numpy().copy() for k, v in model.state_dict().items()},
        "hooks": [len(layer._forward_pre_hooks) + len(layer._forward_post_hooks) for layer in model.sublayers()],
        "add": paddle.Tensor.__add__,
    }


def test_paddle_model_is_unchanged_after_scan_and_after_raising_forward(tiny):
    model, inputs = tiny
    before = _paddle_state(model)
    ampsafe.scan(model, inputs, loss_fn=lambda out: out.mean(), loss_scale=8.0)

    def same():
        after = _paddle_state(model)
        assert before["training"] == after["training"] and before["hooks"] == after["hooks"]
        assert paddle.Tensor.__add__ is before["add"]
        for k, v in before["state"].items():
            np.testing.assert_array_equal(v, after["state"][k], err_msg=k)

    same()
    with pytest.raises(ScanError) as info:
        ampsafe.scan(model, (paddle.randn([2, 5, 32, 32]),))  # wrong channel count: the stem conv raises
    assert info.value.__cause__ is not None
    same()


# --- the dbnet workload (engineer #1's): asserted when it is importable --------------------------------


@pytest.fixture(scope="module")
def dbnet():
    import ampsafe_lab.workloads

    try:
        return ampsafe_lab.workloads.build("dbnet")
    except ImportError as exc:  # pragma: no cover - the workload is part of the package
        pytest.skip(f"dbnet workload not available: {exc}")


@pytest.fixture(scope="module")
def dbnet_report(dbnet):
    return ampsafe.scan(dbnet.model, dbnet.example_inputs)


DBFPN = [f"neck.in{i}_conv" for i in (2, 3, 4, 5)] + [f"neck.p{i}_conv" for i in (2, 3, 4, 5)]


def test_dbnet_the_eight_dbfpn_convs_start_unnormalized_paths(dbnet_report):
    for start in DBFPN:
        assert not dbnet_report.path(start).normalized, start
    assert set(dbnet_report.path("neck.p2_conv").ends) == {"head.binarize.conv1", "head.thresh.conv1"}
    assert set(dbnet_report.path("neck.in5_conv").ends) == {f"neck.p{i}_conv" for i in (2, 3, 4, 5)}


def test_dbnet_backbone_convs_with_batchnorm_are_normalized_se_convs_are_not_risky(dbnet_report):
    backbone = [p for p in dbnet_report.paths if p.start.startswith("backbone.")]
    assert len(backbone) > 30
    for p in backbone:
        if "_se.conv1" in p.start:
            assert not p.normalized and not p.risky, p
        else:
            assert p.normalized, p
    assert not dbnet_report.risky  # at init nothing is near float16's limit


def test_dbnet_o2_step_function_exp_is_a_risky_op(dbnet):
    report = ampsafe.scan(dbnet.model, dbnet.example_inputs, level="O2")
    assert ("head", "exp") in {(o.module, o.op) for o in report.risky_ops}


@pytest.mark.slow
@pytest.mark.trajectory
def test_dbnet_brink_checkpoint_dbfpn_paths_overflow_in_the_forward_pass(brink_seed):
    from ampsafe_lab.workloads.dbnet import brink

    w = brink.brink_workload(seed=brink_seed)  # trained once (~1 min), then cached
    report = ampsafe.scan(w.model, w.example_inputs)
    for start in ("neck.p2_conv", "neck.p3_conv", "neck.p4_conv", "neck.p5_conv"):
        p = report.path(start)
        assert p.risky and p.overflows_in == "forward" and "head.binarize.conv1" in p.ends, p
    assert report.path("head.binarize.conv1").overflows_in == "forward"


def test_ppyolo_only_yolo_outputs_and_se_squeeze_convs_are_unnormalized():
    """ppdet's YOLOv3Head adds its output convs as ``yolo_output.{i}`` (plain Conv2D with bias, straight into
    YOLOv3Loss); every other conv in PP-YOLO tiny is a ConvBNLayer except MobileNetV3's SE squeeze convs."""
    import ampsafe_lab.workloads

    pytest.importorskip("ppdet")
    w = ampsafe_lab.workloads.build("ppyolo", config="tiny")
    report = ampsafe.scan(w.model, w.example_inputs)
    heads = {f"yolo_head.yolo_output.{i}" for i in range(3)}
    unnorm = {p.start for p in report.unnormalized}
    assert heads <= unnorm
    assert all(s.endswith("mid_se.conv1") for s in unnorm - heads), unnorm - heads
    for start in heads:
        assert "<loss>" in report.path(start).ends
    assert sum(p.normalized for p in report.paths) > 60
