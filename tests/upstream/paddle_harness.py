"""What Paddle's fluid-era AmpScaler tests (``paddle_amp_scaler_tests.py``, a recorded copy) need on Paddle 3 and
on a CPU, written for this project.

* ``fluid``: the fluid names the tests use, each resolved to its Paddle 3 spelling (Paddle 3 has no ``fluid``).
  ``fluid.dygraph.AmpScaler`` is read from ``paddle.amp.AmpScaler`` when a test asks for it, so that a test run
  with another scaler class in place of Paddle's uses it there too.
* :func:`gpu_like_amp`: Paddle's scaler turns itself off on a CPU place and outside a float16 ``auto_cast``;
  inside this context it is built as on a GPU (its ``__init__`` is shown a GPU place) and the AMP dtype reads
  float16, as after an ``auto_cast`` on a GPU. Everything else is Paddle's own code.
"""

from __future__ import annotations

import contextlib
import io

import paddle


def _conv2d(
    num_channels,
    num_filters,
    filter_size,
    stride=1,
    padding=0,
    dilation=1,
    groups=None,
    param_attr=None,
    bias_attr=None,
    use_cudnn=True,
    act=None,
    dtype="float32",
):
    """fluid.dygraph.Conv2D's signature on paddle.nn.Conv2D (the tests pass ``act=None``)."""
    if act is not None:
        raise ValueError("fluid.dygraph.Conv2D(act=...) is not mapped: the recorded tests pass act=None")
    return paddle.nn.Conv2D(
        num_channels,
        num_filters,
        filter_size,
        stride=stride,
        padding=padding,
        dilation=dilation,
        groups=groups or 1,
        weight_attr=param_attr,
        bias_attr=bias_attr,
    )


class _Dygraph:
    Layer = paddle.nn.Layer
    guard = staticmethod(paddle.base.dygraph.guard)
    to_variable = staticmethod(paddle.to_tensor)
    Conv2D = staticmethod(_conv2d)

    @property
    def AmpScaler(self):  # noqa: N802 (fluid's name)
        return paddle.amp.AmpScaler


class _Optimizer:
    @staticmethod
    def SGDOptimizer(learning_rate, parameter_list=None, **kwargs):  # noqa: N802 (fluid's name)
        return paddle.optimizer.SGD(learning_rate=learning_rate, parameters=parameter_list, **kwargs)


class _Layers:
    mean = staticmethod(paddle.mean)


class _Fluid:
    dygraph = _Dygraph()
    optimizer = _Optimizer()
    layers = _Layers()
    core = paddle.base.core


fluid = _Fluid()


class _GpuPlace:
    def is_gpu_place(self) -> bool:
        return True


class _GpuTracer:
    _expected_place = _GpuPlace()


def on_a_gpu_place(cls: type) -> type:
    """``cls`` (Paddle's GradScaler or AmpScaler) built as on a GPU place: enabled on this CPU."""
    import paddle.amp.grad_scaler as grad_scaler

    class Forced(cls):
        def __init__(self, *args, **kwargs):
            original = grad_scaler._dygraph_tracer
            grad_scaler._dygraph_tracer = lambda: _GpuTracer()
            try:
                super().__init__(*args, **kwargs)
            finally:
                grad_scaler._dygraph_tracer = original

    Forced.__name__ = Forced.__qualname__ = cls.__name__
    return Forced


@contextlib.contextmanager
def float16_amp_dtype():
    """The AMP dtype reads float16, as after an ``auto_cast`` on a GPU (Paddle's ``scale()`` checks it); the
    scalers' backoff prints are kept out of the test output."""
    from paddle.amp.auto_cast import amp_global_state

    state = amp_global_state()
    old = state.amp_dtype
    state.amp_dtype = "float16"
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        state.amp_dtype = old
