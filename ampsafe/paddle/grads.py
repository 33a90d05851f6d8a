"""The gradient side of ``ampsafe.paddle.GradScaler``: an optimizer's gradients unscaled and checked by Paddle's
fused ``check_finite_and_unscale`` kernel, one call per dtype, and, on the rare floor path, the parameters whose
gradients are non-finite.

Example::

    found_inf = unscale_and_check_(optimizer, scale)   # bool tensor of shape [1]
"""

from __future__ import annotations

from collections import defaultdict

import paddle
from paddle import _C_ops

__all__ = [
    "unscale_and_check_",
    "unscale_params_",
    "nonfinite_params",
    "parameters",
    "gradient",
]


def _check_finite_and_unscale(grads: list, scale):
    """(found_inf bool[1]) after dividing ``grads`` in place by ``scale``: Paddle's fused kernel."""
    if hasattr(_C_ops, "check_finite_and_unscale_"):
        return _C_ops.check_finite_and_unscale_(grads, scale)[1]
    from paddle import _legacy_C_ops

    found = paddle.zeros([1], dtype="bool")
    _legacy_C_ops.check_finite_and_unscale(grads, scale, grads, found)
    return found


def grouped(optimizer) -> bool:
    """Whether ``optimizer`` was built with parameter groups (a list of dicts, each its own options): Paddle's own
    test, in ``Optimizer.__init__``."""
    params = optimizer._parameter_list
    return bool(params) and isinstance(params[0], dict)


def parameters(optimizer) -> list:
    """The parameters ``optimizer`` updates (parameter groups, as Paddle keeps them, or a plain parameter list;
    none for a static-program optimizer built without them)."""
    if grouped(optimizer):
        return [p for g in optimizer._param_groups for p in g["params"]]
    return list(optimizer._parameter_list or [])


def unscale_and_check_(optimizer, scale):
    """Divide every gradient ``optimizer`` holds by ``scale`` in place; returns found_inf (bool, shape [1]),
    True where a gradient was inf/NaN. No host sync."""
    return unscale_params_(parameters(optimizer), scale)


def gradient(param):
    """The gradient the optimizer applies: fleet's float32 ``main_grad`` where the parameter has one (hybrid
    parallel's mixed precision accumulates there), else the parameter's own."""
    main = getattr(param, "main_grad", None)
    return main if main is not None else param._grad_ivar()


def unscale_params_(params, scale):
    """:func:`unscale_and_check_` over the gradients of ``params``."""
    by_dtype: dict = defaultdict(list)
    for param in params:
        grad = gradient(param)
        if grad is not None:
            by_dtype[grad.dtype].append(grad)
    found_inf = None
    for grads in by_dtype.values():
        found = _check_finite_and_unscale(grads, scale)
        found_inf = found if found_inf is None else paddle.logical_or(found_inf, found)
    return paddle.zeros([1], dtype="bool") if found_inf is None else found_inf


def nonfinite_params(optimizer) -> list:
    """(parameter, fallback label) for each parameter whose gradient is non-finite: only on the floor path."""
    found = []
    for p in parameters(optimizer):
        grad = gradient(p)
        if grad is not None and not bool(paddle.isfinite(grad).all().item()):
            found.append((p, f"{p.name} {tuple(p.shape)}"))
    return found
