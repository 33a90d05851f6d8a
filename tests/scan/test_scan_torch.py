"""ampsafe.scan on torch models: real torchvision networks and small models built to show one behaviour."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

import ampsafe  # noqa: E402
from ampsafe.errors import AmpSafeError, ConfigError  # noqa: E402
from ampsafe.scanner import ScanError  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from models import (  # noqa: E402
    Attention,
    ConvReluConv,
    ExpHead,
    Huge,
    Raises,
    SharedTwice,
    WithCustomFunction,
)


def test_resnet18_only_fc_is_unnormalized():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    report = ampsafe.scan(model, (torch.randn(2, 3, 64, 64),))
    assert [p.start for p in report.unnormalized] == ["fc"]
    assert report.path("fc").ends == ("<output>",)
    assert report.path("layer1.0.conv1").ends == ("layer1.0.bn1",)
    assert len(report.paths) == 21  # 20 convs (incl. 3 downsample) + fc


def test_frozen_batchnorm_is_recognised_by_what_it_computes():
    from torchvision.ops.misc import FrozenBatchNorm2d

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10, norm_layer=FrozenBatchNorm2d)
    report = ampsafe.scan(model, (torch.randn(1, 3, 64, 64),))
    assert [p.start for p in report.unnormalized] == ["fc"]
    assert report.path("conv1").normalized and report.path("conv1").ends == ("bn1",)


def _frcnn_expectations(report):
    unnorm = {p.start for p in report.unnormalized}
    fpn = {f"backbone.fpn.{kind}.{i}.0" for kind in ("inner_blocks", "layer_blocks") for i in (0, 1)}
    assert fpn <= unnorm
    assert {"rpn.head.conv.0.0", "roi_heads.box_head.fc6", "roi_heads.box_head.fc7"} <= unnorm
    # backbone convs followed by BatchNorm are normalized; only the SE squeeze convs (conv -> relu -> conv) are not
    backbone = [p for p in report.paths if p.start.startswith("backbone.body.")]
    assert len(backbone) > 50
    for p in backbone:
        if p.start.endswith(".fc1"):
            assert not p.normalized and p.ends == (p.start[: -len("fc1")] + "fc2",)
        else:
            assert p.normalized, p
    # paths branch: the FPN's coarse inner block feeds its layer block and the finer level's add
    inner1 = report.path("backbone.fpn.inner_blocks.1.0")
    assert set(inner1.ends) == {"backbone.fpn.layer_blocks.1.0", "backbone.fpn.layer_blocks.0.0"}
    assert any(op.endswith(":interpolate") for op in inner1.ops) and any(op.endswith(":add") for op in inner1.ops)
    assert not report.risky


def test_frcnn_train_mode_fpn_and_heads_unnormalized_backbone_not(frcnn_train_report):
    _frcnn_expectations(frcnn_train_report)
    assert "<loss>" in frcnn_train_report.path("roi_heads.box_predictor.bbox_pred").ends


def test_frcnn_eval_mode_fpn_and_heads_unnormalized_backbone_not(frcnn_eval_report):
    _frcnn_expectations(frcnn_eval_report)


def test_activation_past_fp16_max_is_risky_with_exact_amax():
    torch.manual_seed(0)
    model, x = Huge(), torch.rand(3, 16)
    true_amax = float(model.fc(x).detach().abs().max())
    assert true_amax > 65504
    path = ampsafe.scan(model, (x,)).path("fc")
    assert path.risky and path.overflows_in == "forward" and path.normalized
    assert path.amax == pytest.approx(true_amax, rel=0.01)
    assert path.headroom_bits == pytest.approx(math.log2(65504 / true_amax), abs=0.02)


def test_backward_overflow_is_told_apart_from_forward_overflow():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    model = ConvReluConv()
    # small activations, but d(loss)/d(activation) = 4 at scale 2**16 is 262144: only the backward overflows
    report = ampsafe.scan(model, (x,), loss_fn=lambda out: out.sum() * 4.0, loss_scale=2.0**16)
    p = report.path("conv2")
    assert p.amax < 100 and p.grad_amax > 65504
    assert p.risky and p.overflows_in == "backward"
    assert (
        ampsafe.scan(model, (x,), loss_fn=lambda out: out.sum() * 4.0, loss_scale=1.0).path("conv2").overflows_in
        is None
    )
    # huge activations: forward, whatever the scale
    huge = ampsafe.scan(Huge(), (torch.rand(3, 16),), loss_fn=lambda out: out.sum(), loss_scale=1.0)
    assert huge.path("fc").overflows_in == "forward"


def test_inplace_relu_keeps_the_path_connected():
    torch.manual_seed(0)
    report = ampsafe.scan(ConvReluConv(), (torch.randn(1, 3, 8, 8),))
    p = report.path("conv1")
    assert p.ends == ("conv2",) and not p.normalized
    assert "act:relu" in p.ops and p.layers == ("conv1", "act", "conv2")
    assert report.path("conv2").ends == ("bn",)


def test_inplace_relu_gradients_are_measured_with_tensor_hooks():
    torch.manual_seed(0)
    report = ampsafe.scan(ConvReluConv(), (torch.randn(1, 3, 8, 8),), loss_fn=lambda o: o.pow(2).mean(), loss_scale=8.0)
    assert report.path("conv1").grad_amax is not None and report.path("conv1").grad_amax > 0


def test_shared_module_nested_outputs_and_no_grad_block():
    torch.manual_seed(0)
    model = SharedTwice()
    a, b = torch.randn(1, 3, 4, 4), torch.randn(1, 3, 4, 4) * 100
    report = ampsafe.scan(model, (a, b))
    starts = [p.start for p in report.paths]
    assert starts.count("conv") == 1  # three calls, one path
    conv = report.path("conv")
    assert "<output>" in conv.ends and "head" in conv.ends and not conv.normalized
    assert conv.amax == pytest.approx(float(model.conv(b).detach().abs().max()), rel=0.01)  # the max over both calls
    assert report.path("head").ends == ("<output>",)
    # keyword inputs work too
    assert ampsafe.scan(model, {"a": a, "b": b}).path("conv").amax == pytest.approx(conv.amax)


def test_calibration_batches_raise_amax():
    torch.manual_seed(0)
    model = ConvReluConv()
    x = torch.randn(1, 3, 8, 8)
    plain = ampsafe.scan(model, (x,)).path("conv1").amax
    calibrated = ampsafe.scan(model, (x,), calibration=[(x * 50,)]).path("conv1").amax
    assert calibrated > 10 * plain


def test_custom_autograd_function_is_traced_and_noted():
    torch.manual_seed(0)
    report = ampsafe.scan(WithCustomFunction(), (torch.randn(1, 3, 4, 4),), loss_fn=lambda o: o.sum(), loss_scale=2.0)
    p = report.path("conv")
    assert p.normalized and p.ends == ("bn",) and ":mul" in p.ops
    assert any("Double" in n for n in report.notes)


def test_attention_checkpointing_and_inference_mode_are_traced():
    torch.manual_seed(0)
    model, x = Attention().train(), torch.randn(2, 5, 16)
    report = ampsafe.scan(model, (x,), loss_fn=lambda o: o["y"].sum(), loss_scale=1024.0)
    assert {p.start for p in report.paths} == {"att", "fc"}
    assert report.path("fc").ends == ("<output>", "<loss>") and report.path("fc").grad_amax == pytest.approx(1024.0)
    model.eval()
    with torch.inference_mode():  # inference tensors have no version counter; MHA takes its fused fast path
        assert {p.start for p in ampsafe.scan(model, (x,)).paths} == {"att", "fc"}


def test_o2_reports_exp_as_risky_op_o1_on_cuda_does_not():
    torch.manual_seed(0)
    model, x = ExpHead(), torch.randn(2, 3, 8, 8)
    o2 = ampsafe.scan(model, (x,), level="O2")
    assert [(o.module, o.op) for o in o2.risky_ops] == [("", "exp")]
    assert o2.risky_ops[0].amax > 65504
    o1 = ampsafe.scan(model, (x,), level="O1", target="cuda")
    assert o1.risky_ops == []  # CUDA autocast runs exp in float32
    # CPU autocast runs exp in its input's dtype, but BatchNorm's float32 statistics are no float16 input there
    assert all(o.op != "conv2d" for o in ampsafe.scan(model, (x,), target="cpu").risky_ops)


def test_autocast_lists_match_torch_for_the_cpu_target():
    import torch.nn.functional as F

    from ampsafe.torch.ops import autocast_fp16_ops

    cuda, cpu = autocast_fp16_ops("cuda", "O1"), autocast_fp16_ops("cpu", "O1")
    assert {"conv2d", "linear", "matmul", "bmm", "baddbmm", "prelu"} <= cuda & cpu
    assert {"mv", "addmv", "addr"} <= cuda - cpu
    assert autocast_fp16_ops("cuda", "O2") is None
    with torch.autocast("cpu", dtype=torch.float16):
        assert torch.mv(torch.randn(3, 4), torch.randn(4)).dtype == torch.float32  # not on the CPU list
        assert F.conv2d(torch.randn(1, 2, 4, 4), torch.randn(2, 2, 1, 1)).dtype == torch.float16


def _state(model):
    return {
        "training": [m.training for m in model.modules()],
        "buffers": {k: v.clone() for k, v in model.state_dict().items()},
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "hooks": [len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules()],
        "rng": torch.get_rng_state(),
    }


def _assert_same(before, after):
    assert before["training"] == after["training"]
    assert before["buffers"].keys() == after["buffers"].keys()
    for k in before["buffers"]:
        assert torch.equal(before["buffers"][k], after["buffers"][k]), k
    for g0, g1 in zip(before["grads"], after["grads"]):
        assert (g0 is None and g1 is None) or torch.equal(g0, g1)
    assert before["hooks"] == after["hooks"]
    assert torch.equal(before["rng"], after["rng"])
    from torch.nn.modules import module as M

    assert not M._global_forward_hooks and not M._global_forward_pre_hooks


def test_model_is_unchanged_after_scan_with_backward():
    torch.manual_seed(0)
    model = ConvReluConv().train()
    model(torch.randn(2, 3, 8, 8)).sum().backward()  # existing gradients must survive
    x = torch.randn(2, 3, 8, 8)
    before = _state(model)
    ampsafe.scan(model, (x,), loss_fn=lambda o: o.sum(), loss_scale=2.0**16)
    _assert_same(before, _state(model))
    assert model.training


def test_model_is_unchanged_after_raising_forward():
    torch.manual_seed(0)
    model = Raises().train()
    x = torch.randn(2, 3, 8, 8)
    before = _state(model)
    with pytest.raises(ScanError) as info:
        ampsafe.scan(model, (x,))
    assert isinstance(info.value, AmpSafeError)
    assert isinstance(info.value.__cause__, RuntimeError) and "boom" in str(info.value.__cause__)
    _assert_same(before, _state(model))


def test_frcnn_is_unchanged_after_scan(frcnn, frcnn_train_report):
    assert frcnn.training and all(m.training for m in frcnn.modules())
    bn = frcnn.backbone.body["1"].block[0][1]
    assert int(bn.num_batches_tracked) == 0 and float(bn.running_mean.abs().sum()) == 0.0


def test_bad_arguments_raise_clear_errors_and_change_nothing():
    model = ConvReluConv()
    x = torch.randn(1, 3, 8, 8)
    with pytest.raises(ConfigError, match="tuple"):
        ampsafe.scan(model, x)
    with pytest.raises(ConfigError, match="level"):
        ampsafe.scan(model, (x,), level="O3")
    with pytest.raises(ConfigError, match="target"):
        ampsafe.scan(model, (x,), target="tpu")
    with pytest.raises(ConfigError, match="loss_fn"):
        ampsafe.scan(model, (x,), loss_scale=4.0)
    with pytest.raises(ampsafe.UnsupportedModelError):
        ampsafe.scan(object(), (x,))


def test_report_renders_markdown_and_json():
    torch.manual_seed(0)
    report = ampsafe.scan(Huge(), (torch.rand(3, 16),))
    md = report.to_markdown()
    assert "| fc |" in md and "**yes**" in md
    data = json.loads(report.to_json())
    assert data["paths"][0]["start"] == "fc" and data["paths"][0]["overflows_in"] == "forward"


def test_cli_scans_a_factory_and_writes_json(tmp_path, capsys, monkeypatch):
    from ampsafe.scan_cli import main

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    out = tmp_path / "scan.json"
    assert main(["models:tiny_factory", "--json", str(out), "--all"]) == 0
    printed = capsys.readouterr().out
    assert "conv1" in printed and "unnormalized" in printed
    assert {p["start"] for p in json.loads(out.read_text())["paths"]} == {"conv1", "conv2"}


def test_patched_island_is_reported_as_protected():
    patching = pytest.importorskip("ampsafe.patching")
    torch.manual_seed(0)
    model, x = Huge(), torch.rand(3, 16)
    assert ampsafe.scan(model, (x,)).path("fc").protected_by is None
    patching.patch(model, (x,), policy="island")
    try:
        assert ampsafe.scan(model, (x,)).path("fc").protected_by == "island"
    finally:
        patching.unpatch(model)


@pytest.mark.gpu
def test_cuda_model_is_scanned_on_its_device():
    torch.manual_seed(0)
    model = ConvReluConv().cuda().train()
    x = torch.randn(2, 3, 8, 8, device="cuda")
    report = ampsafe.scan(model, (x,), loss_fn=lambda o: o.sum(), loss_scale=2.0**16)
    assert report.path("conv1").ends == ("conv2",) and report.path("conv2").grad_amax is not None
    assert float(model.bn.running_mean.abs().sum()) == 0.0
