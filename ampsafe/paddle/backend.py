"""PaddlePaddle's :class:`~ampsafe.core.backend.Backend`: the framework facts scan, patch, watch and heal use."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import paddle

from ..core import backend as core
from ..core.graph import OpKind
from . import WRAPPERS, amp_lists, intercept
from .grads import parameters
from .tensors import LOW_DTYPES, TENSORS

__all__ = ["PaddleBackend", "PaddleAmp", "BACKEND", "LOW_DTYPES", "is_statistic", "innermost_emulator", "amp_dtype"]


def is_statistic(param) -> bool:
    """The one rule for Paddle state that is not trained but moves: a parameter that takes no gradient.

    Paddle's BatchNorm keeps ``_mean``/``_variance`` as parameters with ``stop_gradient=True``; frozen
    weights match too, and restoring what a forward never wrote costs a copy, nothing else.
    """
    return param.stop_gradient or not getattr(param, "trainable", True)


def innermost_emulator():
    """The innermost open float16 emulation (an ``Fp16Emulator``), or None."""
    from .emulate import Fp16Emulator

    return next((m for m in reversed(intercept.active_modes()) if isinstance(m, Fp16Emulator)), None)


def amp_dtype() -> str:
    """The dtype Paddle's ``auto_cast`` casts to now (``"float16"`` / ``"bfloat16"``)."""
    from paddle.amp.auto_cast import amp_global_state

    return amp_global_state().amp_dtype


class PaddleAmp(core.AmpBase):
    """``paddle.amp.auto_cast``: which ops it runs in float16 is Paddle's own lists (:mod:`ampsafe.paddle.amp_lists`),
    with float16 propagated through the ops on neither list as Paddle's promotion does. Its float32 region
    (``intercept.fp32_region``) also keeps ampsafe's float16 emulators off."""

    low_dtypes = LOW_DTYPES
    scaler_args = {"min_scale": "min_loss_scaling", "on_floor": "on_floor"}  # ampsafe.paddle.GradScaler's names
    # O2's ``paddle.amp.decorate`` casts the parameters to float16, so an island there is applied after it
    island_levels = {
        "O2": (
            "Paddle O2, after paddle.amp.decorate",
            "With Paddle O2, island the same modules right after `paddle.amp.decorate(..., level='O2')`: their "
            "compute runs in float32 (decorate's `excluded_layers` alone keeps only their parameters in float32; "
            "their convs stay on the float16 white list):",
        )
    }
    in_float32 = staticmethod(intercept.in_fp32_region)

    @staticmethod
    @contextlib.contextmanager
    def float32():
        with paddle.no_grad(), paddle.amp.auto_cast(enable=False), intercept.fp32_region():
            yield

    @staticmethod
    def runs_low(op, kind, input_halves, *, level, target) -> bool:
        """``target`` is unused: Paddle's lists are the same on every device."""
        if intercept.in_fp32_region():
            return False
        if kind is OpKind.NORM and input_halves:
            input_halves = input_halves[:1]  # batch/layer norm follow X alone: float32 statistics do not promote
        return amp_lists.runs_in_fp16(op, level, inputs_fp16=bool(input_halves) and all(input_halves))

    @staticmethod
    def state() -> tuple:
        """(the innermost float16 emulator or None, Paddle's AMP level, its dtype) now."""
        level = "O0"
        tracer = paddle.framework._dygraph_tracer()
        if tracer is not None:
            level = str(getattr(tracer, "_amp_level", "O0")).rpartition(".")[2]
        return innermost_emulator(), level, amp_dtype()

    @staticmethod
    def replay(state) -> contextlib.ExitStack:
        """No grad, in the captured forward's float16 emulation (re-entered unless still open), else in Paddle's
        ``auto_cast`` at its level."""
        stack = contextlib.ExitStack()
        stack.enter_context(paddle.no_grad())
        emulator, level, dtype = state or (None, "O0", "float32")
        if emulator is not None:
            if emulator not in intercept.active_modes():
                stack.enter_context(emulator)
        elif level in ("O1", "O2"):
            stack.enter_context(paddle.amp.auto_cast(enable=True, level=level, dtype=dtype))
        return stack

    @staticmethod
    def heal_options(state) -> dict:
        """The level the step ran at (the emulator's, else ``auto_cast``'s); O1 when it ran in neither."""
        emulator, level, _ = state or (None, "O0", "float32")
        level = emulator.level if emulator is not None else level
        return {"level": level if level in ("O1", "O2") else "O1"}


class PaddleBackend(core.BackendBase):
    """``paddle.nn.Layer`` models."""

    module_type = paddle.nn.Layer
    wrappers = WRAPPERS

    # -- structure
    def modules(self, model) -> dict:
        return {"": model, **dict(model.named_sublayers())}

    def optimizer_params(self, optimizer) -> list:
        return parameters(optimizer)

    # -- state
    def state_slots(self, model) -> list[tuple[dict, str, paddle.Tensor]]:
        """(holder dict, name, tensor) of every buffer and every statistic (:func:`is_statistic`). A buffer that
        holds no memory yet (``nn.LSTM``'s ``_dropout_state`` until a dropout runs) has nothing to copy back."""
        layers = [model, *model.sublayers()]
        slots = [
            (layer._buffers, n, b)
            for layer in layers
            for n, b in list(layer._buffers.items())
            if b is not None and b._is_initialized()
        ]
        slots += [
            (layer._parameters, n, p)
            for layer in layers
            for n, p in list(layer._parameters.items())
            if p is not None and is_statistic(p)
        ]
        return slots

    def rng_state(self):
        """Paddle's generator, its CUDA one in a CUDA build, NumPy's and Python's ``random`` (ppdet and
        PaddleOCR draw from NumPy)."""
        rng = paddle.get_rng_state()
        cuda = paddle.get_cuda_rng_state() if paddle.device.is_compiled_with_cuda() else None
        np_rng, py_rng = np.random.get_state(), random.getstate()

        def restore() -> None:
            paddle.set_rng_state(rng)
            if cuda is not None:
                paddle.set_cuda_rng_state(cuda)
            np.random.set_state(np_rng)
            random.setstate(py_rng)

        return restore

    # -- processes
    def world_size(self) -> int:
        import paddle.distributed as dist

        return int(dist.get_world_size())

    def all_gather(self, obj) -> list:
        import paddle.distributed as dist

        if not dist.is_initialized() or dist.get_world_size() == 1:
            return [obj]
        gathered: list = []  # Paddle appends to the (empty) list it is given
        dist.all_gather_object(gathered, obj)
        return gathered

    # -- hooks
    def forward_pre_hook(self, model, fn):
        return model.register_forward_pre_hook(lambda layer, args: fn(args, {}))

    def forward_hook(self, module, fn):
        def hook(_layer, _inputs, output) -> None:
            fn(output)  # None back: Paddle keeps the output

        return module.register_forward_post_hook(hook)

    # -- the rest of the adapter package
    def _package(self) -> core.Package:
        from . import trace, watch
        from .swaps import PaddleSwaps

        return core.Package(TENSORS, PaddleAmp(), PaddleSwaps, trace, watch.Watch)


BACKEND = PaddleBackend()
