"""A diagnosis says what it measured: when an op's float32 re-run cannot run, the kind is "unknown" and the
error says why, instead of claiming a numerical error "in float32 too" that was never checked."""

from __future__ import annotations

import pytest

import ampsafe

REASON = "float32 re-run failed"


def _assert_unknown(err, op: str) -> None:
    assert (err.phase, err.op, err.kind) == ("forward", op, "unknown")
    assert err.stats["rerun_float32_finite"] is None
    assert REASON in err.stats["reason"] and REASON in str(err)
    assert "float16-only kernel" in err.stats["reason"]  # the re-run's own exception is named
    assert "in float32 too" not in str(err) and "float16 overflow" not in str(err)


def test_torch_failed_float32_rerun_is_unknown_with_its_reason():
    torch = pytest.importorskip("torch")
    from torch.overrides import handle_torch_function, has_torch_function

    def fp16_only_scale(x):
        """A custom op with a float16 kernel only (like a fused CUDA extension), visible to torch function modes."""
        if has_torch_function((x,)):
            return handle_torch_function(fp16_only_scale, (x,), x)
        if x.dtype != torch.float16:
            raise TypeError(f"float16-only kernel, got {x.dtype}")
        return x * 4096.0

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x):
            return fp16_only_scale(self.fc(x).half() * 64)

    torch.manual_seed(0)
    model, x = Model(), torch.randn(4, 8) * 10
    with pytest.raises(ampsafe.NonFiniteError) as info, ampsafe.watch(model, backward=False):
        model(x)
    _assert_unknown(info.value, "fp16_only_scale")


def test_paddle_failed_float32_rerun_is_unknown_with_its_reason():
    paddle = pytest.importorskip("paddle")
    from ampsafe.paddle import intercept
    from ampsafe.paddle.emulate import emulate_fp16

    class Fp16OnlyConv(intercept.OpMode):
        """A kernel dispatcher with a float16 conv only: it refuses the watcher's float32 re-run."""

        def __call__(self, op, func, args, kwargs):
            if op == "conv2d" and intercept.in_fp32_region():
                raise TypeError("float16-only kernel: conv2d has no float32 implementation here")
            return func(*args, **kwargs)

    class ConvOverflow(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.a = paddle.nn.Conv2D(3, 8, 3, padding=1)
            self.b = paddle.nn.Conv2D(8, 8, 3, padding=1)
            self.b.weight.set_value(self.b.weight * 1e3)

        def forward(self, x):
            return self.b(paddle.nn.functional.relu(self.a(x) * 50))

    paddle.seed(0)
    model, x = ConvOverflow(), paddle.randn([2, 3, 8, 8])
    with pytest.raises(ampsafe.NonFiniteError) as info:
        with emulate_fp16(model), ampsafe.watch(model, backward=False), intercept.op_mode(Fp16OnlyConv()):
            model(x)
    _assert_unknown(info.value, "conv2d")
    assert info.value.module == "b"
