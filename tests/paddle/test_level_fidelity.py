"""Level fidelity on the seed's own loop: PaddleOCR's ``tools/program.py`` train step (``paddle.amp.auto_cast``
around the model forward only, the loss outside it; at O2 ``paddle.amp.decorate(level="O2", master_weight=True)``
first; Paddle's own GradScaler) under ampsafe's emulation of Paddle AMP on a CPU (``amp_emulation``), on DBNet
with DBHead's branches written as PaddleOCR writes them: ``nn.BatchNorm(..., act="relu")``, whose relu Paddle
runs through ``paddle._legacy_C_ops`` (``base.dygraph_utils._append_activation_in_dygraph``).

What Paddle 3.3.1 does (``paddle/amp/amp_lists.py``): ``black_list()["float16"]["O2"]`` is ``EXTRA_BLACK_LIST``
only (the ``*_interp_v2`` ops, ``lookup_table(_v2)``, ``scatter``); ``exp``, ``reciprocal`` and ``sigmoid`` are
on ``FP16_BLACK_LIST``, which only O1 uses. At O2 they are gray: float16 when no floating input is float32, so
DBHead's step function ``reciprocal(1 + exp(-50 (shrink - threshold)))`` runs in float16 after ``decorate`` and
its ``exp`` overflows from step 0. Before ``intercept`` covered the legacy activations, the relu of
``nn.BatchNorm(act="relu")`` came back as a fresh float32 tensor, Paddle's promotion rule then put the rest of
the head (conv2d_transpose, sigmoid, exp, reciprocal) in float32, and the first overflow moved to step 11 at
``head.binarize.conv1``: O1's failure, at O2.

Paddle 2.4 (the seed's 2.4.2): ``python/paddle/fluid/dygraph/amp/auto_cast.py`` has no promotion at O2 (no
``use_promote``; "O2 represent Pure fp16, all operators parameters and input data will be casted to fp16, except
operators in black_list, don't support fp16 kernel and batchnorm") and its O2 list ``PURE_FP16_BLACK_LIST`` is
the same ops as 3.3.1's O2 list plus the grad op ``scatter_grad``: ``emulate_fp16(..., use_promote=False)``.
"""

from __future__ import annotations

import types

import pytest

paddle = pytest.importorskip("paddle")

import paddle.nn.functional as F  # noqa: E402
from paddle import nn  # noqa: E402

from ampsafe.paddle import amp_emulation, emulate_fp16  # noqa: E402
from ampsafe.paddle.backend import BACKEND  # noqa: E402
from ampsafe.paddle.intercept import OpMode, current_module, module_stack, op_mode  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # BatchNorm's "always track global mean"

# Paddle 2.4's O2 list, python/paddle/fluid/dygraph/amp/auto_cast.py (PaddlePaddle/Paddle, the 2.4-era version at
# commit 02c53c2deaa4a3752e53a80f278729600eaa084a: amp_guard(enable, custom_white_list, custom_black_list, level,
# dtype), no use_promote; PURE_FP16_WHITE_LIST = set()).
PADDLE_24_PURE_FP16_BLACK_LIST = frozenset(
    {
        "lookup_table",
        "lookup_table_v2",
        "scatter",
        "scatter_grad",
        "linear_interp_v2",
        "nearest_interp_v2",
        "bilinear_interp_v2",
        "bicubic_interp_v2",
        "trilinear_interp_v2",
    }
)
# ... and its O1 list (BLACK_LIST): exp is there, reciprocal and sigmoid are not (they were gray at O1 too).
PADDLE_24_O1_BLACK_LIST = frozenset(
    "exp square log mean sum cos_sim softmax softmax_with_cross_entropy sigmoid_cross_entropy_with_logits "
    "c_softmax_with_cross_entropy cross_entropy cross_entropy2 reduce_sum linear_interp_v2 nearest_interp_v2 "
    "bilinear_interp_v2 bicubic_interp_v2 trilinear_interp_v2".split()
)


# ------------------------------------------------------------------------------------------------- helpers
def _fluid_bn(bn2d: nn.BatchNorm2D) -> nn.BatchNorm:
    bn = nn.BatchNorm(bn2d._num_features, act="relu")
    bn.set_state_dict(bn2d.state_dict())
    return bn


def _ppocr_branch_forward(self, x):
    """PaddleOCR's ``Head.forward`` (det_db_head.py): BN and relu in one ``nn.BatchNorm(act="relu")``."""
    x = self.conv_bn1(self.conv1(x))
    x = self.conv_bn2(self.conv2(x))
    return F.sigmoid(self.conv3(x))


def _as_ppocr_head(model):
    """The rebuilt DBHead (BatchNorm2D + F.relu) with PaddleOCR's layer types, same weights and statistics."""
    for branch in (model.head.binarize, model.head.thresh):
        branch.conv_bn1 = _fluid_bn(branch.conv_bn1)
        branch.conv_bn2 = _fluid_bn(branch.conv_bn2)
        branch.forward = types.MethodType(_ppocr_branch_forward, branch)
    return model


class _FirstNonFinite(OpMode):
    """Innermost mode: sees each op's output after the emulator rounded it; keeps the first non-finite one."""

    def __init__(self):
        self.first = None

    def __call__(self, op, func, args, kwargs):
        out = func(*args, **kwargs)
        if self.first is None:
            for value in out if isinstance(out, (list, tuple)) else (out,):
                if isinstance(value, paddle.Tensor) and value.dtype == paddle.float32 and value.size:
                    if not bool(paddle.isfinite(value).all()):
                        self.first = (op, current_module())
                        break
        return out


def program_loop(level, steps, *, image_size, batch_size, lr=1e-2, seed=0, use_promote=True, ppocr_head=True):
    """PaddleOCR's train step, ``steps`` times; one record per step: first non-finite op (and module) in the
    forward, whether Paddle's scaler found inf/nan, the ops the emulator ran in float16 / float32."""
    from ampsafe_lab.workloads import build

    amp_emulation.install()
    try:
        work = build("dbnet", seed=seed, image_size=image_size, batch_size=batch_size)
        model = _as_ppocr_head(work.model) if ppocr_head else work.model
        optimizer = work.make_optimizer(lr)
        scaler = paddle.amp.GradScaler(init_loss_scaling=1024.0, use_dynamic_loss_scaling=True)
        if level == "O2":
            model, optimizer = paddle.amp.decorate(models=model, optimizers=optimizer, level="O2", master_weight=True)
        records = []
        for step in range(steps):
            batch = work.batch(step)
            first = _FirstNonFinite()
            with module_stack(BACKEND.modules(model)):
                with paddle.amp.auto_cast(
                    level=level, custom_black_list=[], custom_white_list=[], dtype="float16", use_promote=use_promote
                ):
                    with op_mode(first):
                        preds = model(batch[0])
                    emulator = amp_emulation.current()
            loss = work.loss_fn(preds, batch)["loss"]  # outside auto_cast, as program.py computes it
            scaled = scaler.scale(loss)
            scaled.backward()
            scaler.minimize(optimizer, scaled)
            optimizer.clear_grad()
            records.append(
                {
                    "first": first.first,
                    "found_inf": bool(scaler._found_inf),
                    "fp16": set(emulator.emulated),
                    "fp32": set(emulator.fp32_ops) - set(emulator.emulated),
                }
            )
        return records
    finally:
        amp_emulation.uninstall()


def _first_overflow(records):
    return next(((i, r["first"]) for i, r in enumerate(records) if r["found_inf"]), None)


# --------------------------------------------------------------------------------------------------- unit
def test_batchnorm_act_relu_stays_float16_at_O2_so_the_ops_after_it_do_too():
    """``nn.BatchNorm(act="relu")`` calls ``_legacy_C_ops.relu``: on a GPU its output is float16 at O2 (input
    float16), so a gray op after it (sigmoid, exp) runs in float16 too."""
    paddle.seed(0)
    net = nn.Sequential(nn.Conv2D(1, 2, 1, bias_attr=False), nn.BatchNorm(2, act="relu"))
    x = paddle.rand([2, 1, 4, 4])
    with emulate_fp16(net, level="O2") as emu:
        y = net(x)
        assert emu.is_fp16(y)
        z = paddle.exp(F.sigmoid(y) * 12.0)  # exp(12) > 65504 where the sigmoid is ~1
    assert {"relu", "sigmoid", "exp"} <= emu.emulated
    with emulate_fp16(net, level="O1") as o1:
        assert not o1.is_fp16(paddle.exp(net(x)))  # O1: exp is black
    assert "exp" in o1.fp32_ops and "exp" not in o1.emulated
    assert z.shape == [2, 2, 4, 4]


def test_paddle_33_O2_black_list_is_paddle_24s_without_promotion():
    """Which ops each level keeps in float32, as Paddle's lists say (3.3.1 read from site-packages)."""
    from paddle.amp import amp_lists

    from ampsafe.paddle.amp_lists import black_ops, runs_in_fp16

    o2 = black_ops("O2")
    assert o2 == frozenset(amp_lists.EXTRA_BLACK_LIST)
    assert o2 == PADDLE_24_PURE_FP16_BLACK_LIST - {"scatter_grad"}  # the same ops as 2.4's O2 (a grad op aside)
    assert {"exp", "reciprocal", "sigmoid"}.isdisjoint(o2)
    assert {"exp", "reciprocal"} <= black_ops("O1") and "sigmoid" not in black_ops("O1")
    assert "exp" in PADDLE_24_O1_BLACK_LIST and "reciprocal" not in PADDLE_24_O1_BLACK_LIST
    for op in ("exp", "reciprocal", "sigmoid"):
        assert runs_in_fp16(op, "O2", inputs_fp16=True) and not runs_in_fp16(op, "O2", inputs_fp16=False)


# ------------------------------------------------------------------------------------ PaddleOCR's loop
@pytest.fixture(scope="module")
def small_runs():
    """One PaddleOCR train step per level on a small DBNet (64 px, batch 2), from random init."""
    return {
        "O1": program_loop("O1", 1, image_size=64, batch_size=2),
        "O2": program_loop("O2", 1, image_size=64, batch_size=2),
        "O2-2.4": program_loop("O2", 1, image_size=64, batch_size=2, use_promote=False),
    }


def test_program_loop_O2_runs_dbhead_step_function_in_float16_and_exp_overflows_at_step_0(small_runs):
    (step0,) = small_runs["O2"]
    assert {"exp", "reciprocal", "sigmoid", "conv2d_transpose", "relu"} <= step0["fp16"]
    assert step0["first"] == ("exp", "head") and step0["found_inf"]


def test_program_loop_O1_keeps_exp_in_float32_and_step_0_is_clean(small_runs):
    (step0,) = small_runs["O1"]
    assert "exp" in step0["fp32"] and "reciprocal" in step0["fp32"]
    assert "conv2d" in step0["fp16"]
    assert step0["first"] is None and not step0["found_inf"]


def test_program_loop_O2_as_paddle_24_also_overflows_at_exp_at_step_0(small_runs):
    (step0,) = small_runs["O2-2.4"]
    assert {"exp", "reciprocal"} <= step0["fp16"]
    assert step0["first"] == ("exp", "head") and step0["found_inf"]


def test_rebuilt_head_and_ppocr_head_emulate_the_same_at_O2():
    """The rebuilt DBHead (BatchNorm2D + F.relu, what the demo trains) and PaddleOCR's layer types give the
    same emulated step: same ops in float16, same first overflow."""
    rebuilt = program_loop("O2", 1, image_size=64, batch_size=2, ppocr_head=False)
    ppocr = program_loop("O2", 1, image_size=64, batch_size=2)
    assert rebuilt[0]["first"] == ppocr[0]["first"] == ("exp", "head")
    assert rebuilt[0]["fp16"] == ppocr[0]["fp16"]


def test_demo_O2_wraps_the_forward_only_and_overflows_at_step_0():
    from ampsafe_lab.demo import run_paddle

    trace = run_paddle("native", steps=2, lr=1e-2, level="O2", seed=0, image_size=64, batch_size=2)
    assert trace.overflowed == [True, True]
    assert any("forward only" in note for note in trace.notes)


@pytest.mark.slow
@pytest.mark.trajectory
def test_demo_recipe_program_loop_first_overflow_per_level():
    """The demo's recipe (128 px, batch 8, Adam lr 1e-2, seed 0, scale 1024) in PaddleOCR's loop: O2 overflows
    at DBHead's exp from step 0 (every step); O1 trains until the DBFPN neck drives head.binarize.conv1 past
    65504 (measured: step 11, then every step)."""
    o2 = program_loop("O2", 3, image_size=128, batch_size=8)
    assert all(r["found_inf"] and r["first"] == ("exp", "head") for r in o2)
    o1 = program_loop("O1", 14, image_size=128, batch_size=8)
    step, first = _first_overflow(o1)
    assert first == ("conv2d", "head.binarize.conv1")
    assert 5 <= step < 14
    assert all("exp" in r["fp32"] for r in o1)
