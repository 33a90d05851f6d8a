"""Helpers shared by the scaler tests: tiny real models, gradient fault injection, Paddle's scaler forced on."""

from __future__ import annotations

import contextlib
import io


def torch_model(seed: int = 0, width: int = 8):
    import torch

    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(4, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 1),
    )


def paddle_model(seed: int = 0, width: int = 8):
    import paddle

    paddle.seed(seed)
    return paddle.nn.Sequential(
        paddle.nn.Linear(4, width),
        paddle.nn.ReLU(),
        paddle.nn.Linear(width, width),
        paddle.nn.ReLU(),
        paddle.nn.Linear(width, 1),
    )


def poison_torch_grad(param, value=float("inf"), index=0) -> None:
    param.grad.view(-1)[index] = value


def poison_paddle_grad(param, value=float("inf"), index=0) -> None:
    grad = param._grad_ivar()
    arr = grad.numpy()
    arr.reshape(-1)[index] = value
    grad.set_value(arr)


class _GpuPlace:
    def is_gpu_place(self) -> bool:
        return True


class _GpuTracer:
    _expected_place = _GpuPlace()


def forced_paddle_scaler(**kwargs):
    """paddle.amp.GradScaler as it is built on a GPU: its __init__ only disables itself because the tracer's place
    is a CPU place, so we show it a GPU place while it is constructed; everything else is Paddle's own code."""
    import paddle
    import paddle.amp.grad_scaler as grad_scaler

    original = grad_scaler._dygraph_tracer
    grad_scaler._dygraph_tracer = lambda: _GpuTracer()
    try:
        scaler = paddle.amp.GradScaler(**kwargs)
    finally:
        grad_scaler._dygraph_tracer = original
    assert scaler.is_enable()
    return scaler


@contextlib.contextmanager
def paddle_fp16_amp_state():
    """Paddle's scale() turns the scaler off unless the AMP dtype is float16 (as it is after auto_cast on a GPU)."""
    from paddle.amp.auto_cast import amp_global_state

    state = amp_global_state()
    old = state.amp_dtype
    state.amp_dtype = "float16"
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # Paddle prints on every backoff
            yield
    finally:
        state.amp_dtype = old
