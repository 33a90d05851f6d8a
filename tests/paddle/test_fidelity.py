"""The emulator against real float16: the same conv net (conv, add, upsample, concat, conv+BN head; identical
weights) trained in torch under CPU float16 autocast and in Paddle under emulate_fp16, same data, lr and loss
scale. Compared at O1, where both frameworks run conv in float16 and keep the loss in float32 (torch's CPU
autocast also keeps exp/sum/mean/softmax/log/pow/layer_norm/group_norm in float16, CUDA's in float32: none of
them is in this net). And the seed as a fidelity case: DBNet under O2 vs O1."""

from __future__ import annotations

import math

import fidelity_case as fc  # tests/paddle/fidelity_case.py (pytest puts this folder on sys.path)
import pytest

pytestmark = pytest.mark.trajectory  # float16 trajectories compared step by step

STEPS, LR = 40, 1e-3


def _assert_same_history(ref, emu, *, where):
    assert len(emu) == len(ref), f"first overflow at step {len(emu) - 1} (emulator) vs {len(ref) - 1} ({where})"
    for step, (a, b) in enumerate(zip(ref[:-1], emu[:-1])):
        assert math.isclose(a["loss"], b["loss"], rel_tol=2e-3), f"step {step}: loss {a['loss']} vs {b['loss']}"
        assert a["forward"] is None and b["forward"] is None and not a["backward"] and not b["backward"]


@pytest.fixture(scope="module")
def forward_case():
    return fc.run_torch(STEPS, scale=2.0**16, lr=LR), fc.run_paddle(STEPS, scale=2.0**16, lr=LR)


def test_first_forward_overflow_step_and_layer_match_torch_autocast(forward_case):
    ref, emu = forward_case
    _assert_same_history(ref, emu, where="torch cpu autocast")
    assert 5 <= len(ref) - 1 < STEPS  # trains a while, then overflows
    assert emu[-1]["forward"] == ref[-1]["forward"] == "head_conv"
    # Paddle's relu maps NaN to 0 (torch's propagates it), so Paddle's loss can stay finite past an overflow;
    # the gradients are non-finite in both.
    assert emu[-1]["backward"] and ref[-1]["backward"]


def test_scaled_gradient_overflow_matches_torch_autocast_layer_for_layer():
    ref = fc.run_torch(3, scale=2.0**20, lr=LR)
    emu = fc.run_paddle(3, scale=2.0**20, lr=LR)
    _assert_same_history(ref, emu, where="torch cpu autocast")
    assert ref[-1]["forward"] is None and emu[-1]["forward"] is None  # backward-only overflow
    assert emu[-1]["backward"] == ref[-1]["backward"] != []


@pytest.mark.gpu
def test_first_overflow_matches_torch_cuda_autocast(forward_case):
    _, emu = forward_case
    ref = fc.run_torch(STEPS, scale=2.0**16, lr=LR, device="cuda")
    _assert_same_history(ref, emu, where="torch cuda autocast")
    assert emu[-1]["forward"] == ref[-1]["forward"]


def test_dbnet_overflows_every_step_at_any_scale_under_O2_and_not_under_O1():
    """The seed: scale 1024 halved every 2 steps from step 0 (Paddle 2.x GradScaler decr_every_n_nan_or_inf=2)
    down to 0.0, with a finite loss. Under O2, DBHead's step function exp(50 * ...) overflows float16 and its
    gradient is 0 * inf = NaN whatever the scale; under O1 exp runs in float32."""
    import paddle

    from ampsafe.paddle import emulate_fp16
    from ampsafe_lab.workloads import build

    work = build("dbnet", seed=0, image_size=64, batch_size=2)
    model, batch = work.model, work.batch(0)

    def nonfinite_grads(level, scale):
        model.clear_gradients()
        with emulate_fp16(model, level=level) as emu:
            loss = work.loss(batch)
            (loss * scale).backward()
        bad = [n for n, p in model.named_parameters() if p.grad is not None and not bool(paddle.isfinite(p.grad).all())]
        return float(loss), bad, emu

    for scale in (1024.0, 2.0**-120, 0.0):
        loss, bad, emu = nonfinite_grads("O2", scale)
        assert math.isfinite(loss) and bad, scale
        assert "exp" in emu.emulated
    loss, bad, emu = nonfinite_grads("O1", 2.0**-120)
    assert math.isfinite(loss) and not bad and "exp" not in emu.emulated
