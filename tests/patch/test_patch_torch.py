"""ampsafe.patch on real torch modules: islands, convbn, rescale, rewrite, auto; guarantees of the front."""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from patch_models import build_torch
from torch import nn

import ampsafe
from ampsafe.errors import ConfigError, UnsupportedModelError
from ampsafe.patching import island_layers, patched_modules, protection_of
from ampsafe.policies.rescale import NotHomogeneous


def fp16(fn):
    with torch.autocast("cpu", dtype=torch.float16):
        return fn()


def finite(t) -> bool:
    return bool(torch.isfinite(t).all())


def snapshot(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_state(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def classes(model) -> dict:
    return {n: type(m) for n, m in model.named_modules()}


# --- island -------------------------------------------------------------------------------------------


def test_island_keeps_state_dict_keys_parameter_names_and_identity():
    model = build_torch("overflow")
    keys, params = list(model.state_dict()), dict(model.named_parameters())
    ampsafe.patch(model, policy="island", paths=["conv1", "conv2"])
    assert list(model.state_dict()) == keys
    assert {n: id(p) for n, p in model.named_parameters()} == {n: id(p) for n, p in params.items()}
    assert protection_of(model.conv1) == "island" and protection_of(model.bn) is None


def test_checkpoint_loads_strictly_into_patched_model_and_back():
    plain, patched = build_torch("overflow", seed=1), build_torch("overflow", seed=2)
    ampsafe.patch(patched, policy="island", paths=["conv1", "conv2"])
    patched.load_state_dict(plain.state_dict(), strict=True)
    assert same_state(snapshot(patched), snapshot(plain))
    fresh = build_torch("overflow", seed=3)
    fresh.load_state_dict(patched.state_dict(), strict=True)
    assert same_state(snapshot(fresh), snapshot(plain))


def test_island_makes_overflowing_path_finite_and_keeps_fp32_outputs(torch_input):
    model = build_torch("overflow")
    ref = model(torch_input)
    assert not finite(fp16(lambda: model(torch_input)))
    ampsafe.patch(model, policy="island", paths=["conv1", "conv2"])
    out = fp16(lambda: model(torch_input))
    assert finite(out)
    assert torch.allclose(model(torch_input), ref, rtol=1e-5, atol=1e-5)


def test_islanding_one_layer_fails_but_the_whole_path_works(torch_input):
    model = build_torch("overflow")
    ampsafe.patch(model, policy="island", paths=["conv1"])
    assert not finite(fp16(lambda: model(torch_input)))  # conv2 casts conv1's 1e5 back to float16
    ampsafe.patch(model, policy="island", paths=["conv2"])
    assert finite(fp16(lambda: model(torch_input)))


def test_island_exception_inside_forward_leaves_autocast_enabled():
    model = build_torch("overflow")
    ampsafe.patch(model, policy="island", paths=["conv1"])
    with torch.autocast("cpu", dtype=torch.float16):
        with pytest.raises(RuntimeError):
            model.conv1(torch.randn(1, 5, 8, 8))  # wrong channel count
        assert torch.is_autocast_enabled("cpu")


def test_island_model_pickles_deepcopies_and_saves():
    model = build_torch("overflow")
    ampsafe.patch(model, policy="island", paths=["conv1", "conv2"])
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model), torch.load(buf, weights_only=False)):
        assert patched_modules(clone) == {"conv1": "island", "conv2": "island"}
        x = torch.randn(2, 3, 8, 8)
        assert torch.equal(clone.eval()(x), model.eval()(x))


def test_island_patched_model_survives_torch_export(torch_input):
    model = build_torch("overflow").eval()
    ampsafe.patch(model, policy="island", paths=["conv1", "conv2"])
    ref = model(torch_input)
    exported = torch.export.export(model, (torch_input,))
    assert torch.allclose(exported.module()(torch_input), ref, rtol=1e-5, atol=1e-5)


def test_island_patched_model_survives_onnx_export(tmp_path, torch_input):
    onnx = pytest.importorskip("onnx")
    from onnx.reference import ReferenceEvaluator

    model = build_torch("overflow", gain=1.0).eval()
    ampsafe.patch(model, policy="island", paths=["conv1", "conv2"])
    ref = model(torch_input).detach().numpy()
    path = tmp_path / "island.onnx"
    torch.onnx.export(model, (torch_input,), str(path), dynamo=False, input_names=["x"])
    (out,) = ReferenceEvaluator(onnx.load(str(path))).run(None, {"x": torch_input.numpy()})
    assert abs(out - ref).max() <= 1e-4 * max(1.0, abs(ref).max())


def test_patch_looks_through_dataparallel():
    model = build_torch("overflow")
    wrapped = nn.DataParallel(model)
    report = ampsafe.patch(wrapped, policy="island", paths=["conv1"])
    assert report.patched == ["conv1"] and protection_of(model.conv1) == "island"
    assert island_layers(wrapped) == [model.conv1]
    ampsafe.unpatch(wrapped)
    assert protection_of(model.conv1) is None


# --- front guarantees ---------------------------------------------------------------------------------


def test_unpatch_restores_original_classes_and_state_dict_exactly(torch_input):
    model = build_torch("homogeneous")
    before, kinds = snapshot(model), classes(model)
    ampsafe.patch(model, (torch_input,), policy="rescale", paths=["conv1"], bits=3)
    ampsafe.patch(model, policy="island", paths=["fc"])
    ampsafe.patch(model, policy="convbn", paths=["conv2"], optimizers=[])
    assert set(patched_modules(model).values()) == {"rescale", "island", "convbn"}
    model(torch_input)  # a train-mode forward through the rescaled BatchNorm
    ampsafe.unpatch(model)
    assert classes(model) == kinds and patched_modules(model) == {}
    after = snapshot(model)
    assert list(after) == list(before)
    assert all(torch.equal(after[k], before[k]) for k in before if "running" not in k and "batches" not in k)


def test_patching_twice_is_a_noop(torch_input):
    model = build_torch("overflow")
    first = ampsafe.patch(model, (torch_input,), policy="island")
    kinds = classes(model)
    second = ampsafe.patch(model, (torch_input,), policy="island")
    assert first.patched and second.patched == [] and classes(model) == kinds


def test_failure_midway_rolls_back_every_module(monkeypatch):
    import ampsafe.patching

    model = build_torch("overflow")
    before, kinds = snapshot(model), classes(model)
    real_apply = ampsafe.patching.apply_change
    calls = []

    def failing_apply(swaps, module, change):
        calls.append(change.path)
        if len(calls) == 3:
            raise RuntimeError("injected failure")
        real_apply(swaps, module, change)

    monkeypatch.setattr(ampsafe.patching, "apply_change", failing_apply)
    with pytest.raises(RuntimeError, match="injected"):
        ampsafe.patch(model, policy="island", paths=["conv1", "conv2", "bn", "fc"])
    assert calls == ["conv1", "conv2", "bn"]
    assert classes(model) == kinds and same_state(snapshot(model), before)


def test_filter_fn_narrows_what_is_patched():
    model = build_torch("overflow")
    report = ampsafe.patch(model, policy="island", paths=["conv1", "conv2"], filter_fn=lambda m, p: p != "conv2")
    assert report.patched == ["conv1"] and report.skipped == {"conv2": "excluded by filter_fn"}


def test_bad_arguments_raise_clear_errors_and_change_nothing(torch_input):
    model = build_torch("overflow")
    kinds = classes(model)
    with pytest.raises(ConfigError, match="unknown policy"):
        ampsafe.patch(model, policy="fp32")
    with pytest.raises(ConfigError, match="level"):
        ampsafe.patch(model, policy="island", level="O3")
    with pytest.raises(ConfigError, match="example_inputs"):
        ampsafe.patch(model, policy="island")
    with pytest.raises(ConfigError, match="no module"):
        ampsafe.patch(model, policy="island", paths=["conv9"])
    with pytest.raises(ConfigError, match="no option"):
        ampsafe.patch(model, (torch_input,), policy="island", bits=3)
    with pytest.raises(UnsupportedModelError):
        ampsafe.patch(object(), policy="island", paths=["x"])
    assert classes(model) == kinds


# --- auto / scan integration --------------------------------------------------------------------------


def test_auto_islands_the_risky_paths_scan_finds_and_scan_reports_them_protected(torch_input):
    model = build_torch("overflow")
    before = ampsafe.scan(model, (torch_input,), target="cpu")
    assert before.risky and not any(p.protected for p in before.paths)
    report = ampsafe.patch(model, (torch_input,))
    assert report.policy == "auto" and "conv1" in report.patched and "conv2" in report.patched
    assert "" not in report.patched  # at O1 the root's functional ops follow their inputs' dtype
    assert finite(fp16(lambda: model(torch_input)))
    after = ampsafe.scan(model, (torch_input,), target="cpu")
    assert all(p.protected_by == "island" for p in after.paths if p.start in ("conv1", "conv2"))


def test_island_at_o2_also_islands_the_owners_of_the_paths_functional_ops(torch_input):
    model = build_torch("homogeneous")
    report = ampsafe.patch(model, (torch_input,), level="O2", policy="island")
    assert "" in report.patched  # add/interpolate/relu run in the root's forward


# --- convbn -------------------------------------------------------------------------------------------


def test_convbn_keeps_conv_keys_adds_documented_bn_keys_and_normalizes(torch_input):
    model = build_torch("overflow", gain=20000.0, gain2=3.0)  # conv1 ~5e4 fits, conv2 on top of it overflows
    keys = list(model.state_dict())
    assert not finite(fp16(lambda: model(torch_input)))
    report = ampsafe.patch(model, policy="convbn", paths=["conv1", "fc"], optimizers=[])
    assert report.patched == ["conv1"] and "fc" in report.skipped
    new = [k for k in model.state_dict() if k not in keys]
    assert set(keys) <= set(model.state_dict())
    assert new == [f"conv1.bn.{k}" for k in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")]
    assert finite(fp16(lambda: model(torch_input)))


def test_convbn_refuses_when_an_optimizer_already_holds_the_parameters():
    model = build_torch("overflow")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(UnsupportedModelError, match="optimizer"):
        ampsafe.patch(model, policy="convbn", paths=["conv1"])
    assert protection_of(model.conv1) is None
    del optimizer


def test_convbn_refuses_a_ddp_wrapped_model(tmp_path):
    import torch.distributed as dist

    model = build_torch("overflow")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    try:
        ddp = nn.parallel.DistributedDataParallel(model)
        with pytest.raises(UnsupportedModelError, match="DistributedDataParallel"):
            ampsafe.patch(ddp, policy="convbn", paths=["conv1"], optimizers=[])
        assert protection_of(model.conv1) is None
        ampsafe.patch(ddp, policy="island", paths=["conv1", "conv2"])  # islands keep the parameters: fine
        assert finite(fp16(lambda: ddp(torch.randn(2, 3, 8, 8))))
    finally:
        dist.destroy_process_group()


# --- rescale ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("train", [True, False])
def test_rescale_is_exact_in_fp32_forward_and_weight_gradients(torch_input, train):
    plain = build_torch("homogeneous")
    model = copy.deepcopy(plain)
    report = ampsafe.patch(model, (torch_input,), policy="rescale")
    assert sorted(report.patched) == ["bn", "conv1", "conv3"]
    plain.train(train), model.train(train)
    for _ in range(2):  # the second pass uses running statistics updated through the rescaled BatchNorm
        out_a, out_b = plain(torch_input), model(torch_input)
    out_a.square().sum().backward()
    out_b.square().sum().backward()
    assert torch.allclose(out_b, out_a, rtol=1e-5, atol=1e-7)
    for (name, pa), pb in zip(plain.named_parameters(), model.parameters()):
        assert torch.allclose(pb.grad, pa.grad, rtol=1e-5, atol=1e-7 * pa.grad.abs().max().item()), name
    assert same_state(snapshot(model), snapshot(plain))  # checkpoint values stay in upstream units


def test_rescale_makes_the_path_finite_under_fp16_autocast(torch_input):
    model = build_torch("homogeneous", gain=60000.0)
    assert not finite(fp16(lambda: model(torch_input)))
    report = ampsafe.patch(model, (torch_input,), policy="rescale")
    assert "2^-" in report.details["conv1"]
    assert finite(fp16(lambda: model(torch_input)))
    scan = ampsafe.scan(model, (torch_input,), target="cpu")
    assert scan.path("conv1").protected_by == "rescale" and not scan.risky


def test_rescale_refuses_a_path_with_a_bias_or_a_nonhomogeneous_op(torch_input):
    model = build_torch("overflow")  # conv -> conv -> BN is homogeneous ...
    model.conv2.bias = nn.Parameter(torch.zeros(8))  # ... until conv2 has a bias
    with pytest.raises(NotHomogeneous, match="conv2.*bias"):
        ampsafe.patch(model, (torch_input,), policy="rescale", paths=["conv1"])
    assert patched_modules(model) == {}
    head = build_torch("step")
    with pytest.raises(NotHomogeneous):
        ampsafe.patch(head, (torch.randn(2, 4, 8, 8),), policy="rescale", paths=["conv"])


# --- rewrite ------------------------------------------------------------------------------------------


def test_rewrite_turns_the_logistic_into_sigmoid_exactly_and_finite_in_half():
    head = build_torch("step")
    x = torch.randn(2, 4, 8, 8) * 30
    ref = head(x)
    report = ampsafe.patch(head, policy="rewrite")
    assert report.patched == [""] and "step_function" in report.details[""]
    assert torch.allclose(head(x), ref, rtol=1e-6, atol=1e-7)
    half = copy.deepcopy(head).half()
    xh = x.half().requires_grad_()
    half(xh).sum().backward()
    assert finite(xh.grad)
    ampsafe.unpatch(half)
    xh = x.half().requires_grad_()
    half(xh).sum().backward()
    assert not finite(xh.grad)  # upstream's exp overflows float16: 0 * inf in the backward


@pytest.mark.gpu
def test_island_makes_the_path_finite_under_cuda_fp16_autocast(torch_input):
    model = build_torch("overflow").cuda()
    x = torch_input.cuda()
    ref = model(x)
    with torch.autocast("cuda", dtype=torch.float16):
        assert not finite(model(x))
    ampsafe.patch(model, policy="island", paths=["conv1", "conv2"])
    with torch.autocast("cuda", dtype=torch.float16):
        assert finite(model(x))
    assert torch.allclose(model(x), ref, rtol=1e-5, atol=1e-5)
