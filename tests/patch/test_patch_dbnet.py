"""The DBNet brink checkpoint (FP32-healthy, activations just past 65504) under ampsafe.paddle.emulate_fp16:
unpatched it overflows; island, convbn (after re-training a few steps) and rescale make it finite; rescale is
exact in FP32; at O2 the step-function rewrite makes DBHead's logistic finite."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import ampsafe
from ampsafe.paddle import emulate_fp16
from ampsafe_lab.workloads.dbnet.brink import brink_workload

pytestmark = [pytest.mark.slow, pytest.mark.trajectory]


@pytest.fixture(scope="module")
def brink(brink_seed):
    workload = brink_workload(seed=brink_seed)
    return workload, workload.batch(0), {k: v.numpy().copy() for k, v in workload.model.state_dict().items()}


def restore(workload, state):
    workload.model.set_state_dict({k: paddle.to_tensor(v) for k, v in state.items()})


@pytest.fixture
def fresh(brink):
    """The brink workload and batch, unpatched and at the brink state before and after the test."""
    workload, batch, state = brink
    ampsafe.unpatch(workload.model)
    restore(workload, state)
    workload.model.train()
    yield workload, batch
    ampsafe.unpatch(workload.model)
    restore(workload, state)


class _FirstNonFinite:
    """Forward post-hooks: the first sublayer whose output is non-finite."""

    def __init__(self, model):
        self.first = None
        self.handles = [layer.register_forward_post_hook(self._hook(name)) for name, layer in model.named_sublayers()]

    def _hook(self, name):
        def hook(layer, inputs, output):
            if self.first is None and isinstance(output, paddle.Tensor) and not bool(paddle.isfinite(output).all()):
                self.first = name

        return hook

    def remove(self):
        for h in self.handles:
            h.remove()


def emulated_step(workload, batch, level="O1"):
    """(first non-finite layer or None, loss, names of parameters with non-finite gradients)."""
    model = workload.model
    probe = _FirstNonFinite(model)
    try:
        with emulate_fp16(model, level=level):
            loss = workload.loss(batch)
            loss.backward()
    finally:
        probe.remove()
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not bool(paddle.isfinite(p.grad).all())]
    model.clear_gradients()
    return probe.first, float(loss), bad


def healthy(result) -> bool:
    first, loss, bad = result
    return first is None and np.isfinite(loss) and not bad


def test_brink_overflows_unpatched_and_island_makes_it_finite_with_equal_fp32_outputs(fresh):
    workload, batch = fresh
    model = workload.model
    first, _, _ = unpatched = emulated_step(workload, batch)
    assert not healthy(unpatched) and first is not None and first.startswith(("neck", "head"))
    ref = model(batch[0])["maps"].numpy()
    report = ampsafe.patch(model, workload.example_inputs, policy="island")
    assert {"neck.in5_conv", "neck.p5_conv", "head.binarize.conv1"} <= set(report.patched)
    assert healthy(emulated_step(workload, batch))
    np.testing.assert_allclose(model(batch[0])["maps"].numpy(), ref, rtol=1e-5, atol=1e-5)


def test_brink_convbn_is_finite_after_retraining_a_few_steps(fresh):
    workload, batch = fresh
    model = workload.model
    report = ampsafe.patch(
        model, workload.example_inputs, policy="convbn", optimizers=[], filter_fn=lambda m, p: p.startswith("neck")
    )
    assert len(report.patched) == 8  # DBFPN's eight convs
    optimizer = workload.make_optimizer(1e-3)
    for step in range(2):  # FP32 re-training: the new BatchNorms learn their statistics and affine terms
        loss = workload.loss(workload.batch(step))
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
    assert healthy(emulated_step(workload, batch))


def test_brink_rescale_is_exact_in_fp32_and_finite_in_emulated_fp16(fresh, brink):
    workload, batch = fresh
    model = workload.model

    def fp32_pass():
        out = model(batch[0])["maps"]
        loss = workload.loss(batch)
        loss.backward()
        grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}
        model.clear_gradients()
        return out.numpy(), grads

    ref_out, ref_grads = fp32_pass()
    restore(workload, brink[2])  # undo the running-statistics updates of that pass
    report = ampsafe.patch(model, workload.example_inputs, policy="rescale")
    # which neck convs carry the shift depends on the brink's weights (in2-in5 on some kernels and seeds, p2-p5 on
    # others); the compensation is always at the head's BatchNorms, where those paths end
    patched = set(report.patched)
    ends = {"head.binarize.conv_bn1", "head.thresh.conv_bn1"}
    neck_convs = {f"neck.{kind}{i}_conv" for kind in ("in", "p") for i in (2, 3, 4, 5)}
    assert ends <= patched and patched - ends and patched - ends <= neck_convs, sorted(patched)
    out, grads = fp32_pass()
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        scale = max(float(np.abs(ref_grads[name]).max()), 1e-30)
        assert float(np.abs(g - ref_grads[name]).max()) <= 1e-5 * scale, name
    assert healthy(emulated_step(workload, batch))


def test_brink_auto_at_o2_rewrites_the_step_function_and_makes_the_step_finite(fresh):
    workload, batch = fresh
    model = workload.model
    shrink = paddle.to_tensor(np.linspace(-3, 3, 2 * 64 * 64, dtype="float32").reshape(2, 1, 64, 64))
    thresh = paddle.zeros_like(shrink)

    def step_grad_finite():
        x = shrink.clone()
        x.stop_gradient = False
        with emulate_fp16(model, level="O2"):
            out = model.head.step_function(x, thresh)
        out.sum().backward()
        return bool(paddle.isfinite(out).all()) and bool(paddle.isfinite(x.grad).all())

    ref = model.head.step_function(shrink, thresh).numpy()
    assert not step_grad_finite()
    report = ampsafe.patch(model, workload.example_inputs, level="O2")  # auto: scan at O2 flags head's exp
    assert report.details["head"].startswith("reciprocal(1 + exp(-z)) -> sigmoid(z)")
    assert report.details["neck"].startswith("FP32 island")  # at O2 the neck's own add/concat need it too
    np.testing.assert_allclose(model.head.step_function(shrink, thresh).numpy(), ref, rtol=1e-6, atol=1e-7)
    assert step_grad_finite()
    assert healthy(emulated_step(workload, batch, level="O2"))
