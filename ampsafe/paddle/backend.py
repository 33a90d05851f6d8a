"""PaddlePaddle's :class:`~ampsafe.core.backend.Backend`: the framework facts scan, patch, watch and heal use."""

from __future__ import annotations

import contextlib
import gc

import numpy as np
import paddle

from ..core import backend as core

__all__ = ["PaddleBackend", "BACKEND", "LOW_DTYPES", "is_statistic"]

LOW_DTYPES = (paddle.float16, paddle.bfloat16)  # the low-precision float dtypes AMP computes in

_FLOATS = (paddle.float16, paddle.bfloat16, paddle.float32, paddle.float64)


def is_statistic(param) -> bool:
    """The one rule for Paddle state that is not trained but moves: a parameter that takes no gradient.

    Paddle's BatchNorm keeps ``_mean``/``_variance`` as parameters with ``stop_gradient=True``; frozen
    weights match too, and restoring what a forward never wrote costs a copy, nothing else.
    """
    return param.stop_gradient or not getattr(param, "trainable", True)


class PaddleBackend(core.AdapterModules):
    """``paddle.nn.Layer`` models."""

    name = "paddle"
    tensor_type = paddle.Tensor
    module_type = paddle.nn.Layer

    # -- structure
    def modules(self, model) -> dict:
        return {"": model, **dict(model.named_sublayers())}

    def children(self, module) -> list:
        return list(module.children())

    def parameters(self, module) -> list:
        return list(module.parameters())

    def optimizer_params(self, optimizer) -> list:
        params = list(optimizer._parameter_list or [])
        if params and isinstance(params[0], dict):
            params = [p for group in params for p in group["params"]]
        return params

    def live_modules(self) -> list:
        return [o for o in gc.get_objects() if issubclass(type(o), paddle.nn.Layer)]  # type(): no __class__ lookups

    def owner_of(self, optimizer, candidates=None):
        return core.owner_of(self, optimizer, candidates)

    # -- state
    def state_slots(self, model) -> list[tuple[dict, str, paddle.Tensor]]:
        """(holder dict, name, tensor) of every buffer and every statistic (:func:`is_statistic`)."""
        layers = [model, *model.sublayers()]
        slots = [(layer._buffers, n, b) for layer in layers for n, b in list(layer._buffers.items()) if b is not None]
        slots += [
            (layer._parameters, n, p)
            for layer in layers
            for n, p in list(layer._parameters.items())
            if p is not None and is_statistic(p)
        ]
        return slots

    def state_tensors(self, model) -> list:
        return [t for _, _, t in self.state_slots(model)]

    def snapshot(self, model):
        slots = self.state_slots(model)
        copies = [t.clone() for _, _, t in slots]

        def restore() -> None:
            with paddle.no_grad():
                for (holder, name, t), saved in zip(slots, copies):
                    holder[name] = t
                    t.set_value(saved)

        return restore

    def norm_stats(self, layer):
        """(mean, variance) a normalization keeps as running statistics, or None: the one rule (``_mean`` /
        ``_variance`` as Paddle's BatchNorm keeps them, or ``running_mean`` / ``running_var`` as frozen BN
        variants in ppdet do; parameters or buffers)."""
        held = {**(getattr(layer, "_buffers", None) or {}), **(getattr(layer, "_parameters", None) or {})}
        for names in (("_mean", "_variance"), ("running_mean", "running_var")):
            mean, var = held.get(names[0]), held.get(names[1])
            if mean is not None and var is not None:
                return mean, var
        return None

    def running_stats(self, model):
        for path, layer in model.named_sublayers(include_self=True):
            stats = self.norm_stats(layer)
            if stats is not None:
                yield path, layer, *stats

    def reset_running_stats(self, mean, var) -> None:
        mean.set_value(np.zeros(mean.shape, dtype="float32"))
        var.set_value(np.ones(var.shape, dtype="float32"))

    # -- numerics
    @contextlib.contextmanager
    def float32(self):
        from .intercept import fp32_region

        with paddle.no_grad(), paddle.amp.auto_cast(enable=False), fp32_region():
            yield

    def all_finite(self, t) -> bool:
        return t.size == 0 or bool(paddle.isfinite(t).all())

    def to_numpy(self, t):
        if not isinstance(t, paddle.Tensor) or t.dtype not in _FLOATS:
            return None
        return t.detach().astype("float32").numpy()

    def abs_max(self, t):
        """Two reductions, no full-size ``|t|`` temporary."""
        return paddle.maximum(paddle.max(t), -paddle.min(t))

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

    # -- the rest of the adapter package
    def _package(self):
        from . import patch, trace, watch

        return trace, watch, patch


BACKEND = PaddleBackend()
