"""ampsafe.patch on real Paddle layers, under ampsafe.paddle.emulate_fp16 (Paddle has no float16 CPU kernels)."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import paddle
import pytest
from patch_models_paddle import build_paddle

import ampsafe
from ampsafe.errors import UnsupportedModelError
from ampsafe.paddle import emulate_fp16
from ampsafe.patching import island_layers, patched_modules, protection_of


def finite(t) -> bool:
    return bool(paddle.isfinite(t).all())


def emulated(model, x, level="O1"):
    with emulate_fp16(model, level=level):
        return model(x)


def snapshot(model) -> dict:
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def same_state(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(np.array_equal(a[k], b[k]) for k in a)


def classes(model) -> dict:
    return {n: type(m) for n, m in model.named_sublayers(include_self=True)}


def test_island_keeps_keys_and_loads_checkpoints_both_ways():
    plain, model = build_paddle("overflow", seed=1), build_paddle("overflow", seed=2)
    keys = list(model.state_dict())
    ids = {n: id(p) for n, p in model.named_parameters()}
    ampsafe.patch(model, policy="island", paths=["conv1", "conv2"])
    assert list(model.state_dict()) == keys and {n: id(p) for n, p in model.named_parameters()} == ids
    missing, unexpected = model.set_state_dict(plain.state_dict())
    assert not missing and not unexpected and same_state(snapshot(model), snapshot(plain))
    fresh = build_paddle("overflow", seed=3)
    fresh.set_state_dict(model.state_dict())
    assert same_state(snapshot(fresh), snapshot(plain))


def test_island_makes_the_path_finite_under_emulated_fp16_and_one_layer_is_not_enough(paddle_input):
    model = build_paddle("overflow")
    ref = model(paddle_input)
    assert not finite(emulated(model, paddle_input))
    ampsafe.patch(model, policy="island", paths=["conv1"])
    assert not finite(emulated(model, paddle_input))  # conv2 rounds conv1's 1e5 back through float16
    ampsafe.patch(model, policy="island", paths=["conv2"])
    assert finite(emulated(model, paddle_input))
    np.testing.assert_allclose(model(paddle_input).numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)


def test_island_patched_layer_survives_jit_save(tmp_path, paddle_input):
    model = build_paddle("overflow")
    ampsafe.patch(model, policy="island", paths=["conv1", "conv2"])
    model.eval()
    ref = model(paddle_input)
    spec = [paddle.static.InputSpec([None, 3, 16, 16], "float32", "x")]
    paddle.jit.save(model, str(tmp_path / "island"), input_spec=spec)
    loaded = paddle.jit.load(str(tmp_path / "island"))
    np.testing.assert_allclose(loaded(paddle_input).numpy(), ref.numpy(), rtol=1e-5, atol=1e-5)
    assert protection_of(model.conv1) == "island"


def test_island_layers_are_what_o2_decorate_must_exclude():
    """decorate is a no-op on CPU, so check the mark it sets from excluded_layers (it casts the rest)."""
    from paddle.amp.auto_cast import set_excluded_layers

    model = build_paddle("overflow")
    ampsafe.patch(model, policy="island", paths=["conv1"])
    assert island_layers(model) == [model.conv1]
    set_excluded_layers([model], island_layers(model))
    assert model.conv1._cast_to_low_precision is False
    assert getattr(model.conv2, "_cast_to_low_precision", True) is True


def test_unpatch_and_failure_midway_restore_the_layer_exactly(monkeypatch, paddle_input):
    import ampsafe.patching

    model = build_paddle("homogeneous")
    before, kinds = snapshot(model), classes(model)
    ampsafe.patch(model, (paddle_input,), policy="rescale", bits=4)
    ampsafe.patch(model, policy="island", paths=["fc"])
    assert set(patched_modules(model).values()) == {"rescale", "island"}
    ampsafe.unpatch(model)
    assert classes(model) == kinds and same_state(snapshot(model), before)

    real_apply, calls = ampsafe.patching.apply_change, []

    def failing_apply(swaps, module, change):
        calls.append(change.path)
        if len(calls) == 2:
            raise RuntimeError("injected failure")
        real_apply(swaps, module, change)

    monkeypatch.setattr(ampsafe.patching, "apply_change", failing_apply)
    with pytest.raises(RuntimeError, match="injected"):
        ampsafe.patch(model, policy="island", paths=["conv1", "conv2", "fc"])
    assert classes(model) == kinds and same_state(snapshot(model), before)


def test_patched_layer_pickles():
    model = build_paddle("overflow")
    ampsafe.patch(model, policy="island", paths=["conv1"])
    clone = pickle.loads(pickle.dumps(model))
    assert patched_modules(clone) == {"conv1": "island"}
    assert protection_of(copy.deepcopy(model).conv1) == "island"


def test_convbn_adds_paddleocr_convbnlayer_keys_and_refuses_a_held_optimizer(paddle_input):
    model = build_paddle("overflow")
    keys = list(model.state_dict())
    optimizer = paddle.optimizer.Adam(parameters=model.parameters())
    with pytest.raises(UnsupportedModelError, match="optimizer"):
        ampsafe.patch(model, policy="convbn", paths=["conv1"])
    del optimizer
    report = ampsafe.patch(model, policy="convbn", paths=["conv1"], optimizers=[], act="relu")
    assert report.patched == ["conv1"]
    assert [k for k in model.state_dict() if k not in keys] == [
        f"conv1.bn.{k}" for k in ("weight", "bias", "_mean", "_variance")
    ]
    assert finite(emulated(model, paddle_input))


@pytest.mark.parametrize("train", [True, False])
def test_rescale_is_exact_for_paddleocr_batchnorm_in_train_and_eval(paddle_input, train):
    plain = build_paddle("homogeneous")
    model = build_paddle("homogeneous")
    report = ampsafe.patch(model, (paddle_input,), policy="rescale")
    assert sorted(report.patched) == ["bn", "conv1", "conv3"]
    for m in (plain, model):
        m.train() if train else m.eval()
    for _ in range(2):
        out_a, out_b = plain(paddle_input), model(paddle_input)
    (out_a**2).sum().backward()
    (out_b**2).sum().backward()
    np.testing.assert_allclose(out_b.numpy(), out_a.numpy(), rtol=1e-5, atol=1e-7)
    for (name, pa), pb in zip(plain.named_parameters(), model.parameters()):
        if pa.grad is not None:
            np.testing.assert_allclose(pb.grad.numpy(), pa.grad.numpy(), rtol=1e-5, atol=1e-6, err_msg=name)
    assert same_state(snapshot(model), snapshot(plain))


def test_rescale_makes_the_homogeneous_path_finite_under_emulated_fp16(paddle_input):
    model = build_paddle("homogeneous", gain=60000.0)
    assert not finite(emulated(model, paddle_input))
    ampsafe.patch(model, (paddle_input,), policy="rescale")
    assert finite(emulated(model, paddle_input))


def test_rewrite_makes_the_logistic_exact_and_finite_under_o2(paddle_input):
    head = build_paddle("step")
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((2, 4, 8, 8)).astype("float32") * 30)
    ref = head(x)

    def grad_finite():
        xx = x.clone()
        xx.stop_gradient = False
        with emulate_fp16(head, level="O2"):
            out = head(xx)
        out.sum().backward()
        return finite(out) and finite(xx.grad)

    assert not grad_finite()
    report = ampsafe.patch(head, policy="rewrite")
    assert report.patched == [""]
    np.testing.assert_allclose(head(x).numpy(), ref.numpy(), rtol=1e-6, atol=1e-7)
    assert grad_finite()
