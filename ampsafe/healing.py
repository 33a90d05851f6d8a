"""Self-healing AMP: at the loss-scale floor, find the paths that overflow, make them FP32 islands, go on.

    scaler = ampsafe.torch.GradScaler(min_scale=1.0, on_floor="heal")   # or ampsafe.paddle.GradScaler
    ampsafe.heal(model, scaler=scaler)                                   # attach: heals at the floor
    ...                                                                  # the usual training loop

    ampsafe.heal(model, scaler=scaler, patience=2)                       # or: after 2 overflowing steps in a row
    paths = ampsafe.heal(model, lambda: (images,))                       # custom loops: heal now, on this batch

At a heal the last batch (kept by a forward pre-hook) is replayed: non-finite inputs -> error naming the sample;
non-finite output (or ``loss_fn`` loss) in float32 -> error (a numerical failure); else ``scan`` finds the paths
within ``margin_bits`` of 65504, ``patch(policy="island", paths=...)`` islands them, running statistics that
the overflowing forwards poisoned are reset, and the scaler restarts from the scale before the collapse.

Why it can work: islands keep parameter identity, so the optimizer and its state go on untouched; only the
overflowing paths pay for float32. Why it gives up: an overflow that is not in the model (non-finite data) or
that float32 has too (a numerical error) is not a precision problem, and more islands would hide it.
Distributed (torch.distributed / paddle.distributed initialized): verdicts are all-gathered, every rank raises
the same error or islands the union of the paths found on any rank.
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any, Callable, Optional

import numpy as np

from ._framework import call, framework_of, unwrap
from .core.report import RiskPath
from .core.scale import HealPlan
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


def _all_gather(framework: str, obj) -> list:
    """``obj`` of every rank, in rank order (``[obj]`` outside a process group), so all ranks decide alike.

    torch fills a list of world size; Paddle's ``all_gather_object`` appends to the (empty) list it is given.
    """
    if framework == "torch":
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return [obj]
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, obj)
        return gathered
    import paddle.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    gathered = []
    dist.all_gather_object(gathered, obj)
    return gathered


def restore_scale(history) -> Optional[float]:
    """The scale before the collapse: walk back over the recent scales while they do not decrease.

    The core's ``last_clean_scale`` is the scale of the last clean step, which during a collapse may already be
    the floor (an overflow that only the backward had stops at a small enough scale, then comes back).
    """
    hist = [float(s) for s in history]
    if not hist:
        return None
    i = len(hist) - 1
    while i > 0 and hist[i - 1] >= hist[i]:
        i -= 1
    return hist[i]


def _running_stats(model, framework: str):
    """(path, module, mean, var) of every normalization layer that keeps running statistics."""
    named = model.named_modules() if framework == "torch" else model.named_sublayers(include_self=True)
    for path, m in named:
        if framework == "torch":
            mean, var = getattr(m, "running_mean", None), getattr(m, "running_var", None)
        else:
            mean, var = getattr(m, "_mean", None), getattr(m, "_variance", None)
        if mean is not None and var is not None:
            yield path, m, mean, var


def _repair_running_stats(model, framework: str) -> list[str]:
    """Reset the running statistics that the overflowing forwards made non-finite; returns their layers.

    A skipped step still ran its forward, and a train-mode BatchNorm after an overflowing conv folded inf/NaN
    into its running mean and variance: training (batch statistics) goes on, but eval would be NaN. They restart
    from their initial values (mean 0, variance 1) and re-converge at the layer's momentum.
    """
    repaired = []
    for path, _layer, mean, var in _running_stats(model, framework):
        if framework == "torch":
            import torch

            if bool(torch.isfinite(mean).all()) and bool(torch.isfinite(var).all()):
                continue
            with torch.no_grad():
                mean.zero_()
                var.fill_(1.0)
        else:
            if np.isfinite(mean.numpy()).all() and np.isfinite(var.numpy()).all():
                continue
            mean.set_value(np.zeros(mean.shape, dtype="float32"))
            var.set_value(np.ones(var.shape, dtype="float32"))
        repaired.append(path)
    return repaired


def _float32_replay(model, framework: str, inputs, loss_fn) -> Optional[str]:
    """Run ``model`` on ``inputs`` in float32 (no autocast, no emulation, no grad, buffers restored).

    Returns what was non-finite ("the output" / "the loss"), or None when float32 is finite.
    """
    if framework == "torch":
        import torch

        buffers = {k: v.detach().clone() for k, v in model.named_buffers()}
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.no_grad())
            stack.enter_context(torch.autocast("cpu", enabled=False))
            if torch.cuda.is_available():
                stack.enter_context(torch.autocast("cuda", enabled=False))
            try:
                out = call(model, inputs)
                loss = loss_fn(out) if loss_fn is not None else None
            finally:
                for k, v in model.named_buffers():
                    if k in buffers:
                        v.copy_(buffers[k])
    else:
        import paddle

        from .paddle.intercept import fp32_region

        kept = [t for _, _, mean, var in _running_stats(model, framework) for t in (mean, var)]
        kept += [v for _, v in model.named_buffers()]
        saved = [t.numpy().copy() for t in kept]
        with paddle.no_grad(), paddle.amp.auto_cast(enable=False), fp32_region():
            try:
                out = call(model, inputs)
                loss = loss_fn(out) if loss_fn is not None else None
            finally:
                for t, value in zip(kept, saved):
                    t.set_value(value)
    if any(not np.isfinite(a).all() for a in _arrays(out)):
        return "the model's output"
    if loss is not None and any(not np.isfinite(a).all() for a in _arrays(loss)):
        return "the loss"
    return None


class Healer:
    """A scaler's ``heal_hook``: remembers the model's last inputs and islands what overflows on them.

    ``margin_bits``: a path is healed when its float32 abs-max comes within this many bits of 65504 on the
    replayed batch (1 bit: above 32752), so it does not overflow again on the next, slightly larger batch.
    ``max_heals``: give up with :class:`LossScaleFloorError` after that many heals. ``loss_fn(output)``:
    optional; lets the float32 check look at the loss and the search find paths whose *gradients* overflow.

    Every check is collective: each rank replays its own last batch, the verdicts are all-gathered, and every
    rank raises the same error or patches the same union of paths, so the replicas stay identical.
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
        if not isinstance(max_heals, int) or max_heals < 0:
            raise ConfigError(f"max_heals must be an int >= 0, got {max_heals!r}")
        if loss_fn is not None and not callable(loss_fn):
            raise ConfigError("loss_fn must be callable: loss_fn(output) -> scalar tensor")
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

    def find(self, inputs, loss_scale: Optional[float] = None) -> list[RiskPath]:
        """The unprotected paths that overflow (or come within ``margin_bits`` of it) on ``inputs``.

        With ``loss_fn`` and nothing near the edge in the forward, the backward at ``loss_scale`` is searched too.
        """
        from .scanner import scan

        report = scan(self.model, inputs, level=self.level, target=self.target, margin_bits=self.margin_bits)
        found = [p for p in report.paths if p.risky and not p.protected]
        if not found and self.loss_fn is not None and loss_scale:
            report = scan(
                self.model,
                inputs,
                level=self.level,
                target=self.target,
                margin_bits=self.margin_bits,
                loss_fn=self.loss_fn,
                loss_scale=loss_scale,
            )
            found = [p for p in report.paths if p.overflows_in and not p.protected]
        return found

    def _local_verdict(self, loss_scale: Optional[float]) -> tuple[str, Any]:
        """("data", (input, sample)) | ("float32", what) | ("paths", {start: amax}) for this rank's last batch."""
        if self.last_inputs is None:
            return "nothing", None
        bad = nonfinite_sample(self.last_inputs)
        if bad is not None:
            return "data", bad
        what = _float32_replay(self.model, self.framework, self.last_inputs, self.loss_fn)
        if what is not None:
            return "float32", what
        found = self.find(self.last_inputs, loss_scale)
        return "paths", {p.start: p for p in found}

    def __call__(self, scaler=None, info=None, *, off_floor: bool = False) -> Optional[HealPlan]:
        """Heal on the last batch (the scaler's hook). ``off_floor=True`` (a streak of overflows above the floor):
        heal only when the replayed forward pass overflows, else return ``None`` (also when no heals are left),
        so the scaler goes on backing off: a backward-only overflow is what loss scaling is for."""
        step = getattr(info, "step", len(self.heals))
        history = getattr(info, "scale_history", ())
        err = {"offenders": getattr(info, "offenders", ()), "scale_history": history}
        if off_floor and len(self.heals) >= self.max_heals:
            return None
        if len(self.heals) >= self.max_heals:
            raise LossScaleFloorError(
                f"gave up after {len(self.heals)} heals (max_heals={self.max_heals}); the overflow persists. Healed "
                f"so far: {[h['paths'] for h in self.heals]}. See ampsafe.scan(model, inputs).to_markdown().",
                **err,
            )
        floor = float(history[-1]) if history else None
        verdicts = _all_gather(self.framework, self._local_verdict(floor))
        many = len(verdicts) > 1
        where = (lambda r: f"rank {r}: ") if many else (lambda r: "")
        if all(kind == "nothing" for kind, _ in verdicts):
            raise LossScaleFloorError(
                "ampsafe.heal has no batch to replay: the model has not run a forward since the healer was attached",
                **err,
            )
        for rank, (kind, detail) in enumerate(verdicts):
            if kind == "data":
                raise LossScaleFloorError(
                    f"not healed: the overflow is not in the model: {where(rank)}input {detail[0]} of the batch of "
                    f"step {step} is non-finite at sample {detail[1]}. Fix the data (ampsafe.check_targets / ampsafe.watch "
                    "name such samples).",
                    **err,
                )
        for rank, (kind, detail) in enumerate(verdicts):
            if kind == "float32":
                raise LossScaleFloorError(
                    f"not healed: {where(rank)}{detail} is non-finite in float32 too on the replayed batch: a "
                    "numerical error (log/sqrt/division of a bad value, a diverging learning rate), not a float16 "
                    "range problem, so FP32 islands would not fix it. Run the step under ampsafe.watch(model) "
                    "to name the op.",
                    **err,
                )
        by_start: dict[str, RiskPath] = {}
        for kind, detail in verdicts:
            if kind == "paths":
                for start, path in detail.items():
                    old = by_start.get(start)
                    if old is None or _amax(path) > _amax(old):
                        by_start[start] = path
        names = sorted(by_start)
        amax = {n: by_start[n].amax for n in names}
        if off_floor and not any(by_start[n].overflows_in == "forward" for n in names):
            # near the edge is not over it: this streak is a backward overflow, which a smaller scale fixes
            log.info("ampsafe heal at step %s: the forward pass is in range; the scaler backs off", step)
            return None
        if not names:
            raise LossScaleFloorError(
                "not healed: the replayed batch is finite in float32 and nothing in the model comes within "
                f"{self.margin_bits:g} bits of float16's max on it (on any rank); the non-finite values come from "
                "elsewhere (the loss, a custom op, the optimizer). Run the step under ampsafe.watch(model) to name "
                "the op.",
                **err,
            )
        from .patching import patch

        result = patch(self.model, policy="island", level=self.level, paths=[by_start[n] for n in names])
        reset = _repair_running_stats(self.model, self.framework)
        restored = restore_scale(history)
        record = {
            "step": step,
            "paths": names,
            "patched": list(result.patched),
            "amax": amax,
            "scale": restored,
            "reset_running_stats": reset,
        }
        self.heals.append(record)
        log.warning(
            "ampsafe heal at step %s: islanded %d paths (%s), max amax %s; scale restored to %s%s",
            step,
            len(names),
            ", ".join(names),
            _fmt_max(amax),
            restored,
            f"; reset non-finite running statistics of {', '.join(reset)}" if reset else "",
        )
        return HealPlan(tuple(result.patched) or tuple(names), restored)


def _heal_on_streak(scaler, healer: Healer, patience: int) -> None:
    """Wrap ``scaler.update`` (on the instance) to heal after ``patience`` overflowing steps in a row."""
    original = scaler.update
    streak = [0]
    in_range = [False]  # the last check found the forward in range: wait for a clean step before checking again

    def update(*args, **kwargs):
        stats = scaler.stats
        overflows, heals = stats.overflow_steps, len(stats.heals)
        result = original(*args, **kwargs)
        if len(stats.heals) > heals or stats.overflow_steps == overflows:
            streak[0], in_range[0] = 0, False  # healed at the floor, or a clean step
            return result
        streak[0] += 1
        if streak[0] >= patience and not in_range[0]:
            streak[0] = 0
            step = stats.total_steps - 1
            info = scaler.floor_info(step)
            plan = healer(scaler, info, off_floor=True)
            if plan is None:
                in_range[0] = True
            else:
                scaler.apply_heal(step, plan, info)
        return result

    update.__doc__ = original.__doc__
    scaler.update = update


def _amax(path: RiskPath) -> float:
    return -1.0 if path.amax is None or math.isnan(path.amax) else float(path.amax)


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
    patience: Optional[int] = None,
):
    """Attach self-healing to ``scaler``, or heal ``model`` now on the batch ``batch_fn()`` returns.

    With ``scaler`` (an ampsafe GradScaler built with ``on_floor="heal"``): installs a :class:`Healer` as its
    ``heal_hook`` and returns it; at the floor it replays the last batch, islands the overflowing paths and the
    scaler restarts from the scale before the collapse. Without: ``batch_fn()`` gives ``example_inputs`` for
    ``model(...)``; the overflowing paths are islanded at once and their module paths returned.

    ``patience``: also heal after that many overflowing steps in a row, without waiting for the floor (a forward
    overflow skips every step whatever the scale, so halving down to the floor only loses steps). It watches
    ``scaler.update()`` (Paddle's ``minimize`` bypasses it: use ``step`` + ``update``) and counts the overflows
    the host knows of (torch on CUDA decides steps on the device and tells the host only now and then).
    """
    if patience is not None and (not isinstance(patience, int) or patience < 1):
        raise ConfigError(f"patience must be an int >= 1 (overflowing steps in a row) or None, got {patience!r}")
    if scaler is None and batch_fn is None:
        raise ConfigError("ampsafe.heal needs a scaler to attach to (scaler=...) or a batch_fn returning inputs")
    healer = Healer(model, level=level, target=target, margin_bits=margin_bits, max_heals=max_heals, loss_fn=loss_fn)
    if scaler is not None:
        policy = getattr(scaler, "policy", None)
        if policy is not None and getattr(policy, "on_floor", "heal") != "heal":
            healer.detach()
            raise ConfigError(f"the scaler was built with on_floor={policy.on_floor!r}; build it with on_floor='heal'")
        scaler.heal_hook = healer
        if patience is not None:
            _heal_on_streak(scaler, healer, patience)
        return healer
    healer.detach()
    healer.last_inputs = batch_fn()
    return list(healer(None, None).paths)
