"""The gradient side of ``ampsafe.torch.GradScaler``: an optimizer's gradients unscaled and checked by torch's
fused kernel, one call per (device, dtype), and, on the rare floor path, the parameters whose gradients are
non-finite.

Example::

    found = unscale_and_check_(optimizer, inv_scale, torch.zeros(()), allow_fp16=False)  # {device: found_inf}
"""

from __future__ import annotations

from collections import defaultdict

import torch

__all__ = ["unscale_and_check_", "nonfinite_params"]


def unscale_and_check_(optimizer, inv_scale: torch.Tensor, found_inf: torch.Tensor, allow_fp16: bool) -> dict:
    """Multiply every gradient ``optimizer`` holds by ``inv_scale`` in place (``_amp_foreach_non_finite_check_and_
    unscale_``, as torch's scaler) and return ``{device: found_inf}`` (> 0 where a gradient was inf/NaN).
    float16 gradients raise unless ``allow_fp16``; sparse ones are checked through their values."""
    by_device: dict = defaultdict(lambda: defaultdict(list))
    with torch.no_grad():
        for group in optimizer.param_groups:
            for param in group["params"]:
                grad = param.grad
                if grad is None:
                    continue
                if not allow_fp16 and grad.dtype == torch.float16:
                    raise ValueError("Attempting to unscale FP16 gradients.")
                if grad.is_sparse:
                    if grad.dtype is torch.float16:
                        param.grad = grad = grad.coalesce()
                    grad = grad._values()
                by_device[grad.device][grad.dtype].append(grad)
        found: dict = {}
        for device, by_dtype in by_device.items():
            dev_found = found_inf if found_inf.device == device else found_inf.to(device, copy=True)
            dev_inv = inv_scale if inv_scale.device == device else inv_scale.to(device)
            for grads in by_dtype.values():
                torch._amp_foreach_non_finite_check_and_unscale_(grads, dev_found, dev_inv)
            found[device] = dev_found
    return found


def nonfinite_params(optimizer) -> list:
    """(parameter, fallback label) for every parameter whose gradient is non-finite: only on the floor path."""
    found = []
    with torch.no_grad():
        for g, group in enumerate(optimizer.param_groups):
            for i, p in enumerate(group["params"]):
                grad = p.grad
                if grad is None:
                    continue
                values = grad._values() if grad.is_sparse else grad
                if not bool(torch.isfinite(values).all()):
                    found.append((p, f"param_groups[{g}].params[{i}] {tuple(p.shape)}"))
    return found
