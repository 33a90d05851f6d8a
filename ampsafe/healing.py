"""Self-healing AMP: at the loss-scale floor, find the paths that overflow, make them FP32 islands, go on.

    scaler = ampsafe.torch.GradScaler(min_scale=1.0, on_floor="heal")   # or ampsafe.paddle.GradScaler
    ampsafe.heal(model, scaler=scaler)                                   # attach: heals at the floor
    ...                                                                  # the usual training loop

    paths = ampsafe.heal(model, lambda: (images,))                       # custom loops: heal now, on this batch

Why it can work: islands keep parameter identity, so the optimizer and its state go on untouched; only the
overflowing paths pay for float32. Why it gives up: an overflow that is not in the model (non-finite data) or
that float32 has too (a numerical error) is not a precision problem, and more islands would hide it.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Optional

import numpy as np

from ._framework import framework_of, unwrap
from .core.report import RiskPath
from .errors import ConfigError, LossScaleFloorError

__all__ = ["heal", "Healer"]

log = logging.getLogger("ampsafe.heal")


def _to_numpy(x) -> Optional[np.ndarray]:
    if hasattr(x, "detach"):  # torch
        x = x.detach().float().cpu().numpy()
    elif hasattr(x, "numpy") and hasattr(x, "place"):  # paddle
        x = x.astype("float32").numpy()
    if isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.floating):
        return x
    return None


def _arrays(inputs):
    """Every floating array in a nest of tuples, lists and dicts."""
    if isinstance(inputs, dict):
        for v in inputs.values():
            yield from _arrays(v)
    elif isinstance(inputs, (list, tuple)):
        for v in inputs:
            yield from _arrays(v)
    else:
        a = _to_numpy(inputs)
        if a is not None:
            yield a


def nonfinite_sample(inputs) -> Optional[tuple[int, int]]:
    """(input index, batch index) of the first non-finite value in the model's inputs, or None."""
    for i, a in enumerate(_arrays(inputs)):
        bad = ~np.isfinite(a)
        if bad.any():
            return i, int(np.argwhere(bad)[0][0]) if a.ndim else 0
    return None


def _all_gather_paths(framework: str, paths: list[str]) -> list[str]:
    """Union of the path lists of every rank, so all ranks patch the same modules (or just ``paths``)."""
    if framework == "torch":
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return paths
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, paths)
    else:
        import paddle.distributed as dist

        if not dist.is_initialized() or dist.get_world_size() == 1:
            return paths
        gathered = []
        dist.all_gather_object(gathered, paths)
    return sorted({p for rank in gathered for p in rank})


class Healer:
    """A scaler's ``heal_hook``: remembers the model's last inputs and islands what overflows on them.

    ``margin_bits``: a path is healed when its float32 abs-max comes within this many bits of 65504 on the
    replayed batch (1 bit: above 32752), so it does not overflow again on the next, slightly larger batch.
    ``max_heals``: give up with :class:`LossScaleFloorError` after that many heals.
    """

    def __init__(
        self,
        model,
        *,
        level: str = "O1",
        target: str = "cuda",
        margin_bits: float = 1.0,
        max_heals: int = 3,
        loss_fn: Optional[Callable] = None,
    ):
        self.model = unwrap(model)
        self.framework = framework_of(self.model)
        self.level, self.target, self.margin_bits = level, target, margin_bits
        self.max_heals, self.loss_fn = max_heals, loss_fn
        self.heals: list[dict] = []
        self.last_inputs: Any = None
        self._handle = self._remember_inputs()

    def _remember_inputs(self):
        def keep(module, args, kwargs=None):
            self.last_inputs = dict(kwargs) if kwargs and not args else tuple(args)

        if self.framework == "torch":
            return self.model.register_forward_pre_hook(keep, with_kwargs=True)
        return self.model.register_forward_pre_hook(lambda layer, args: keep(layer, args))

    def detach(self) -> None:
        """Stop remembering inputs (the hook is removed)."""
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def find(self, inputs) -> list[RiskPath]:
        """The unprotected paths that overflow (or come within ``margin_bits`` of it) on ``inputs``."""
        from .scanner import scan

        report = scan(
            self.model, inputs, level=self.level, target=self.target, margin_bits=self.margin_bits, loss_fn=self.loss_fn
        )
        return [p for p in report.paths if p.risky and not p.protected]

    def __call__(self, scaler=None, info=None) -> list[str]:
        step = getattr(info, "step", len(self.heals))
        if self.last_inputs is None:
            raise LossScaleFloorError(
                "ampsafe.heal has no batch to replay: the model has not run a forward since the healer was attached"
            )
        bad = nonfinite_sample(self.last_inputs)
        if bad is not None:
            raise LossScaleFloorError(
                f"not healed: the overflow is not in the model: input {bad[0]} of the last batch is non-finite at "
                f"sample {bad[1]}. Fix the data (ampsafe.check_targets / ampsafe.watch name such samples).",
                offenders=getattr(info, "offenders", ()),
                scale_history=getattr(info, "scale_history", ()),
            )
        if len(self.heals) >= self.max_heals:
            raise LossScaleFloorError(
                f"gave up after {len(self.heals)} heals (max_heals={self.max_heals}); the overflow persists. Healed "
                f"so far: {[h['paths'] for h in self.heals]}. See ampsafe.scan(model, inputs).to_markdown().",
                offenders=getattr(info, "offenders", ()),
                scale_history=getattr(info, "scale_history", ()),
            )
        found = self.find(self.last_inputs)
        if not found and info is not None and info.modules:
            # Nothing overflows forward in float32: the gradients do. Island the paths through those modules.
            from .scanner import scan

            report = scan(self.model, self.last_inputs, level=self.level, target=self.target, margin_bits=0.0)
            offenders = set(info.modules)
            found = [p for p in report.paths if not p.protected and offenders & set(p.layers)]
        names = _all_gather_paths(self.framework, sorted({p.start for p in found}))
        if not names:
            raise LossScaleFloorError(
                "not healed: nothing in the model overflows float16 on the replayed batch, and no offending "
                "module was named; the non-finite values come from the loss or the data (a numerical error, "
                "not a precision one). Run the step under ampsafe.watch(model) to name the op.",
                offenders=getattr(info, "offenders", ()),
                scale_history=getattr(info, "scale_history", ()),
            )
        by_start = {p.start: p for p in found}
        targets = [by_start.get(n, n) for n in names]
        from .patching import patch

        result = patch(self.model, policy="island", level=self.level, paths=targets)
        amax = {p.start: p.amax for p in found}
        record = {"step": step, "paths": names, "patched": list(result.patched), "amax": amax}
        self.heals.append(record)
        scale = getattr(info, "scale_before_collapse", None)
        log.warning(
            "ampsafe heal at step %s: islanded %d paths (%s), max amax %s; scale restored to %s",
            step,
            len(names),
            ", ".join(names),
            _fmt_max(amax),
            scale,
        )
        return list(result.patched) or names


def _fmt_max(amax: dict) -> str:
    vals = [v for v in amax.values() if v is not None]
    if not vals:
        return "-"
    m = max(vals)
    return "inf" if math.isinf(m) else f"{m:.3g}"


def heal(
    model,
    batch_fn: Optional[Callable[[], Any]] = None,
    *,
    scaler=None,
    level: str = "O1",
    target: str = "cuda",
    margin_bits: float = 1.0,
    max_heals: int = 3,
    loss_fn=None,
):
    """Attach self-healing to ``scaler``, or heal ``model`` now on the batch ``batch_fn()`` returns.

    With ``scaler`` (an ampsafe GradScaler built with ``on_floor="heal"``): installs a :class:`Healer` as its
    ``heal_hook`` and returns it; at the floor it replays the last batch, islands the overflowing paths and the
    scaler restarts from the scale before the collapse. Without: ``batch_fn()`` gives ``example_inputs`` for
    ``model(...)``; the overflowing paths are islanded at once and their module paths returned.
    """
    if scaler is None and batch_fn is None:
        raise ConfigError("ampsafe.heal needs a scaler to attach to (scaler=...) or a batch_fn returning inputs")
    healer = Healer(model, level=level, target=target, margin_bits=margin_bits, max_heals=max_heals, loss_fn=loss_fn)
    if scaler is not None:
        policy = getattr(scaler, "policy", None)
        if policy is not None and getattr(policy, "on_floor", "heal") != "heal":
            healer.detach()
            raise ConfigError(f"the scaler was built with on_floor={policy.on_floor!r}; build it with on_floor='heal'")
        scaler.heal_hook = healer
        return healer
    healer.detach()
    healer.last_inputs = batch_fn()
    return healer(None, None)
