"""The healer a scaler calls at the loss-scale floor: replay the last batch, decide, island what overflows.

Why a class of its own: it holds the only state of a heal (the last inputs, the heals so far) and makes every
decision collectively (verdicts all-gathered through the model's Backend), so all ranks raise the same error
or island the same union of paths. The facts it decides on come from :mod:`ampsafe.healing.evidence`.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable, Optional

from .._framework import backend_of, unwrap
from ..core.capture import InputCapture
from ..core.graph import FP16_MAX
from ..core.report import RiskOp, RiskPath
from ..core.scale import HealPlan
from ..errors import ConfigError, LossScaleFloorError
from .evidence import float32_replay, nonfinite_sample, repair_running_stats, restore_scale

__all__ = ["Healer"]

log = logging.getLogger("ampsafe.heal")


class Healer:
    """A scaler's ``heal_hook``: remembers the model's last inputs and islands what overflows on them.

    ``margin_bits``: a path is healed when its float32 abs-max comes within this many bits of 65504 on the
    replayed batch (1 bit: above 32752), so it does not overflow again on the next, slightly larger batch.
    ``max_heals``: give up with :class:`LossScaleFloorError` after that many heals. ``loss_fn(output)``:
    optional; lets the float32 check look at the loss and the search find paths whose *gradients* overflow.
    ``capture``: an :class:`~ampsafe.core.capture.InputCapture` of ``model`` to replay from (a scaler lends
    its own); without it the healer captures the inputs itself.

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
        capture: Optional[InputCapture] = None,
    ):
        if not isinstance(max_heals, int) or max_heals < 0:
            raise ConfigError(f"max_heals must be an int >= 0, got {max_heals!r}")
        if loss_fn is not None and not callable(loss_fn):
            raise ConfigError("loss_fn must be callable: loss_fn(output) -> scalar tensor")
        self.model = unwrap(model)
        self.backend = backend_of(self.model)
        self.framework = self.backend.name
        self.level, self.target, self.margin_bits = level, target, margin_bits
        self.max_heals, self.loss_fn = max_heals, loss_fn
        self.heals: list[dict] = []
        self._given: Any = None  # inputs set by hand (``heal(model, batch_fn)``), else the capture's
        self._own_capture = capture is None
        self.capture = InputCapture(self.backend, self.model) if capture is None else capture

    @property
    def last_inputs(self) -> Any:
        """The batch a heal replays: set by hand, or the inputs of the model's latest forward (a tuple of
        arguments, or a dict for a forward called with keyword arguments only)."""
        if self._given is not None:
            return self._given
        latest = self.capture.latest
        if latest is None:
            return None
        args, kwargs = latest
        return dict(kwargs) if kwargs and not args else tuple(args)

    @last_inputs.setter
    def last_inputs(self, inputs: Any) -> None:
        self._given = inputs

    def detach(self) -> None:
        """Stop remembering inputs (the hook is removed; a capture the scaler lent stays with the scaler)."""
        if self._own_capture:
            self.capture.remove()

    def find(self, inputs, loss_scale: Optional[float] = None) -> list[RiskPath]:
        """The unprotected paths that overflow (or come within ``margin_bits`` of it) on ``inputs``.

        With ``loss_fn`` and nothing near the edge in the forward, the backward at ``loss_scale`` is searched too.
        """
        return self._search(inputs, loss_scale)[0]

    def _search(self, inputs, loss_scale: Optional[float]) -> tuple[list[RiskPath], list[RiskOp]]:
        """:meth:`find`'s paths, and the unprotected risky non-conv/matmul ops (Paddle O2 runs DBHead's
        step-function ``exp`` in float16: no conv/matmul path overflows there, the ``exp`` does)."""
        from ..scanner import scan

        report = scan(self.model, inputs, level=self.level, target=self.target, margin_bits=self.margin_bits)
        found = [p for p in report.paths if p.risky and (not p.protected or self._open_layers(p))]
        ops = [o for o in report.risky_ops if not o.protected_by]
        if not found and not ops and self.loss_fn is not None and loss_scale:
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
        return found, ops

    def _open_layers(self, path: RiskPath) -> list[str]:
        """The layers of an islanded path that still run in float16: an island's float32 output that grew past
        65504 overflows again where a float16 consumer casts it, so those consumers join the island."""
        from ..patching import patched_modules

        islands = [m for m, how in patched_modules(self.model).items() if how == "island"]
        return [
            layer
            for layer in path.layers
            if not any(layer == q or layer.startswith(q + ".") or q == "" for q in islands)
        ]

    def _local_verdict(self, loss_scale: Optional[float]) -> tuple[str, Any]:
        """("data", (input, sample)) | ("float32", what) | ("paths", ({start: RiskPath}, {"module:op": RiskOp}))
        for this rank's last batch."""
        if self.last_inputs is None:
            return "nothing", None
        bad = nonfinite_sample(self.last_inputs, self.backend)
        if bad is not None:
            return "data", bad
        what = float32_replay(self.backend, self.model, self.last_inputs, self.loss_fn)
        if what is not None:
            return "float32", what
        found, ops = self._search(self.last_inputs, loss_scale)
        return "paths", ({p.start: p for p in found}, {f"{o.module}:{o.op}": o for o in ops})

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
        with self.capture.paused():  # the replays below are not the step's forward
            local = self._local_verdict(floor)
        verdicts = self.backend.all_gather(local)  # every rank decides alike
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
        by_op: dict[str, RiskOp] = {}
        for kind, detail in verdicts:
            if kind == "paths":
                paths, ops = detail
                for start, path in paths.items():
                    old = by_start.get(start)
                    if old is None or _amax(path) > _amax(old):
                        by_start[start] = path
                for key, op in ops.items():
                    old = by_op.get(key)
                    if old is None or _amax(op) > _amax(old):
                        by_op[key] = op
        names = sorted(by_start)
        op_keys = sorted(by_op)
        amax = {n: by_start[n].amax for n in names}
        amax.update({k: by_op[k].amax for k in op_keys})
        forward = any(by_start[n].overflows_in == "forward" for n in names) or any(
            _amax(by_op[k]) > FP16_MAX for k in op_keys
        )
        if off_floor and not forward:
            # near the edge is not over it: this streak is a backward overflow, which a smaller scale fixes
            log.info("ampsafe heal at step %s: the forward pass is in range; the scaler backs off", step)
            return None
        if not names and not op_keys:
            raise LossScaleFloorError(
                "not healed: the replayed batch is finite in float32 and nothing in the model comes within "
                f"{self.margin_bits:g} bits of float16's max on it (on any rank); the non-finite values come from "
                "elsewhere (the loss, a custom op, the optimizer). Run the step under ampsafe.watch(model) to name "
                "the op.",
                **err,
            )
        # a risky op is islanded with the module whose forward runs it (the smallest one the trace names)
        op_modules = [m for m in dict.fromkeys(by_op[k].module for k in op_keys) if m not in names]
        if "" in op_modules:
            raise LossScaleFloorError(
                f"not healed: {', '.join(k for k in op_keys if by_op[k].module == '')} overflows float16 in the "
                "model's own forward (no submodule runs it), and an FP32 island of the whole model is no AMP at all. "
                "Move the op into a submodule, or keep it in float32 (Paddle: auto_cast(custom_black_list=[...]))",
                **err,
            )
        from ..patching import patch

        targets = [by_start[n] for n in names] + op_modules
        result = patch(self.model, policy="island", level=self.level, paths=targets)
        reset = repair_running_stats(self.backend, self.model)
        restored = restore_scale(history)
        record = {
            "step": step,
            "paths": names + op_modules,
            "ops": op_keys,
            "patched": list(result.patched),
            "amax": amax,
            "scale": restored,
            "reset_running_stats": reset,
        }
        self.heals.append(record)
        risky: dict[str, list[str]] = {}
        for k in op_keys:
            risky.setdefault(by_op[k].module, []).append(by_op[k].op)
        listed = names + [f"{m} (risky {', '.join(ops)})" for m, ops in risky.items() if m not in names]
        log.warning(
            "ampsafe heal at step %s: islanded %d paths (%s), max amax %s; scale restored to %s%s",
            step,
            len(names) + len(op_modules),
            ", ".join(listed),
            _fmt_max(amax),
            restored,
            f"; reset non-finite running statistics of {', '.join(reset)}" if reset else "",
        )
        return HealPlan(tuple(result.patched) or tuple(names + op_modules), restored)


def _amax(found: RiskPath | RiskOp) -> float:
    return -1.0 if found.amax is None or math.isnan(found.amax) else float(found.amax)


def _fmt_max(amax: dict) -> str:
    vals = [v for v in amax.values() if v is not None]
    if not vals:
        return "-"
    m = max(vals)
    return "inf" if math.isinf(m) else f"{m:.3g}"
