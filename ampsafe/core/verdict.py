"""The one record of what a heal measured on the last batch: :class:`HealVerdict`.

Why one typed record: the floor error, the heal's log line, the run report and the healer's decision all talk
about the same evidence (which pass overflowed, in which module and op, how large the value is in float32,
which parameters, which sample of the data). Gathered once (:mod:`ampsafe.healing.floor_replay` replays the batch
under the sentinel, :class:`ampsafe.healing.Healer` adds what its scan found), each reader takes the fields it
needs, and the sentence a :class:`~ampsafe.errors.LossScaleFloorError` carries is rendered from them here.
Pure data: picklable, so ranks all-gather it; no framework import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from .graph import FP16_MAX

__all__ = ["HealVerdict", "MAX_NAMED", "WHERE"]

MAX_NAMED = 8  # parameters named in a backward verdict; the rest are counted
# "forward": the sentinel saw the forward pass go non-finite; "backward": the forward replayed finite and gradients
# overflowed; "data": a model input was non-finite before the model ran; "loss": the forward was finite, the loss
# scale() saw was not; "none": nothing reproduced on this process; "not replayed": no batch (``reason`` says why);
# "scanned": not replayed under the sentinel, only scanned (a heal before the floor, or ``heal(model, batch_fn)``);
# "generation": an HF ``generate`` sampled from non-finite probabilities; its rerun named the module (``ampsafe run``).
WHERE = ("forward", "backward", "data", "loss", "none", "not replayed", "scanned", "generation")


@dataclass(frozen=True)
class HealVerdict:
    """What the replay of the last batch (and a heal's scan of it) measured.

    ``module``/``op``/``kind``/``sample``: where the sentinel first saw a non-finite value (forward), or the
    bad sample (data, with ``input``, the index of the input). ``amax_fp32``: max |output| of ``module`` in
    float32 on the same batch. ``params``: parameters whose gradients overflowed, from the loss backwards.
    ``float32_nonfinite``: what was non-finite in float32 too ("the model's output" / "the loss"; a numerical
    error, which no FP32 island fixes). ``paths``/``ops``: the unprotected RiskPaths and RiskOps a heal's scan
    found (what it would island). ``reason``: why nothing was replayed.
    """

    where: str
    module: Optional[str] = None
    op: Optional[str] = None
    kind: Optional[str] = None
    amax_fp32: Optional[float] = None
    sample: Optional[int] = None
    input: Optional[int] = None
    params: tuple = ()
    float32_nonfinite: Optional[str] = None
    paths: tuple = ()
    ops: tuple = ()
    reason: str = ""

    @property
    def replayed(self) -> bool:
        """Whether the batch was there to look at (its data check ran)."""
        return self.where != "not replayed"

    @property
    def forward_overflow(self) -> bool:
        """Whether the scan found a path or op whose float32 value leaves float16's range in the forward pass
        (near the edge is not over it: a streak of overflows without one is a backward overflow)."""
        return any(p.overflows_in == "forward" for p in self.paths) or any(_amax(o.amax) > FP16_MAX for o in self.ops)

    @property
    def text(self) -> str:
        """The sentence a floor error carries after "the last batch overflows in" (or "was", not replayed)."""
        if self.where == "not replayed":
            return f"not replayed: {self.reason}"
        if self.where == "data":
            return (
                f"the data: input {self.input} of the last batch is non-finite at sample {self.sample} (before the "
                "model ran)"
            )
        if self.where == "forward":
            where = self.module or "<root>"
            sample = f", first in sample {self.sample}" if self.sample is not None else ""
            return (
                f"the forward pass: the first non-finite value comes from {where}:{self.op} (kind {self.kind!r}"
                f"{sample}){self._magnitude(where)}"
            )
        if self.where == "loss":
            return (
                "the loss: the model's forward pass replayed finite, yet the loss passed to scale() was non-finite, "
                "so the overflow is in the loss computation after the model; no loss scale can fix this"
            )
        if self.where == "backward":
            n = len(self.params)
            return (
                f"the backward pass: the model's forward pass replayed finite, and the gradients of {n} "
                f"parameter{'s' if n != 1 else ''} overflowed (from the loss backwards): {_named(list(self.params))}"
            )
        if self.where == "scanned":
            return "the batch was scanned, not replayed under ampsafe.watch"
        if self.where == "generation":
            return (
                f"a generation's forward pass: it sampled from non-finite probabilities; the first module output "
                f"holding an inf/NaN in its rerun was {self.module or '<root>'}'s"
            )
        return (
            "nothing reproduced on this process: the model's forward pass replayed finite and no gradient the "
            "optimizer holds here was non-finite (they were on another rank, or outside the optimizers)"
        )

    def _magnitude(self, where: str) -> str:
        amax = self.amax_fp32
        if amax is None:
            return ""
        if not math.isfinite(amax):
            return "; it is non-finite in float32 too"
        if amax > FP16_MAX:
            return f"; in float32 its output reaches |x| = {amax:.4g} (float16's max is {FP16_MAX:g})"
        # e.g. DBHead's step function: exp overflows, the module's output is a bounded map
        return (
            f"; in float32 {where}'s output stays within |x| <= {amax:.4g}: the overflow is inside it, at its {self.op}"
        )


def _named(names: list) -> str:
    text = ", ".join(names[:MAX_NAMED])
    if len(names) > MAX_NAMED:
        text += f" and {len(names) - MAX_NAMED} more"
    return text


def _amax(value: Optional[float]) -> float:
    return -1.0 if value is None or math.isnan(value) else float(value)
