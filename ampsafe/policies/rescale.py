"""``rescale``: move a positively homogeneous path into float16 range by a constant power of two, exactly.

If every op from a path's starting conv/matmul up to the normalization that ends it is positively
homogeneous (bias-free conv/matmul, ReLU, add of two path tensors, resample, concat, max-pool...), then
scaling the path's *input* by s = 2^-k scales everything up to the normalization by s, and the normalization
undoes it when its running statistics are scaled by s, s^2 and its epsilon by s^2. ampsafe does that scaling
inside the normalization's forward only (stored statistics stay in upstream units, so checkpoints, state_dict
keys and values are unchanged and need no hooks), and s is a constant, not a weight, so Adam cannot swamp
it. With powers of two the float32 forward is bit-exact and the weights get the same gradients; the path's
activation gradients grow by 2^k instead (k bits of range move into the backward pass: the loss scale settles
k bits lower).

The region is found on the traced graph (``ScanReport.graph``), so ``rescale`` needs ``example_inputs`` or a
report from ``ampsafe.scan``. A path that is not homogeneous up to a normalization is refused with the op
that breaks it.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from dataclasses import dataclass, field

from ..core.graph import FP16_MAX, START_KINDS, Graph, OpKind
from ..core.swaps import SwapMixin, swap
from ..errors import ConfigError, UnsupportedModelError
from . import Change, PatchContext, Plan, PolicyConfig, action, path_starts, register

__all__ = ["Rescale", "RescaledInput", "Region", "NotHomogeneous", "homogeneous_region", "shift_bits", "plan_rescale"]

MAX_BITS = 126  # 2^-126 is float32's smallest normal number: a larger shift would flush the path to zero


@dataclass(frozen=True)
class Rescale(PolicyConfig):
    """``policy=Rescale()`` (shorthand ``"rescale"``): an exact power-of-two shift on homogeneous paths.

    ``bits``: the shift k (input x 2^-k) for every region; None picks, per region, the least k that leaves
    ``margin_bits`` of float16 headroom.
    """

    name = "rescale"
    bits: int | None = None

    def __post_init__(self):
        b = self.bits
        if b is None:
            return
        if isinstance(b, bool) or not isinstance(b, numbers.Integral) or not 1 <= b <= MAX_BITS:
            raise ConfigError(f"Rescale.bits must be None or a whole number from 1 to {MAX_BITS}, got {b!r}")
        object.__setattr__(self, "bits", int(b))


class RescaledInput(SwapMixin):
    """The mixin of a region's start: multiplies the first input by the constant ``_ampsafe_scale`` (a power of
    two) before the forward; written once for every framework. The end's mixin, which touches the framework's
    statistics, is ``backend.swaps.rescaled_norm``."""

    _ampsafe_protection = "rescale"
    _ampsafe_attrs = ("_ampsafe_scale",)

    def forward(self, x, *args, **kwargs):
        return self._ampsafe_base.forward(self, x * self._ampsafe_scale, *args, **kwargs)


@action("rescale_input", protection=RescaledInput._ampsafe_protection)
def scale_input(swaps, module, change: Change) -> None:
    swap(module, RescaledInput, _ampsafe_scale=float(change.params["scale"]))


@action("rescale_norm", protection=RescaledInput._ampsafe_protection)
def compensate_norm(swaps, module, change: Change) -> None:
    swap(module, swaps.rescaled_norm, _ampsafe_scale=float(change.params["scale"]))  # the framework's norm mixin


# Ops f with f(s*x) = s*f(x) for s > 0, in one scaled input (others: constants or unscaled side inputs).
_UNARY = {
    "relu",
    "relu_",
    "leaky_relu",
    "hardtanh_identity",
    "identity",
    "dropout",
    "interpolate",
    "upsample",
    "upsample_nearest",
    "upsample_bilinear",
    "upsample_nearest2d",
    "upsample_bilinear2d",
    "nearest_interp",
    "bilinear_interp",
    "resize",
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "pool2d",
    "avg_pool1d",
    "avg_pool2d",
    "avg_pool3d",
    "adaptive_avg_pool2d",
    "adaptive_max_pool2d",
    "reshape",
    "view",
    "flatten",
    "transpose",
    "permute",
    "squeeze",
    "unsqueeze",
    "contiguous",
    "clone",
    "pad",
    "getitem",
    "slice",
    "split",
    "chunk",
    "unbind",
    "expand",
    "repeat",
    "neg",
    "copy",
    "to",
    "cast",
    "pixel_shuffle",
    "sum",
    "mean",
}
_ALL_SCALED = {"add", "add_", "sub", "sub_", "concat", "cat", "stack", "maximum", "minimum", "max", "min"}
_ONE_SCALED = {"mul", "mul_", "div", "div_", "scale", "matmul", "linear", "bmm", "mm", "einsum"}


class NotHomogeneous(UnsupportedModelError):
    """The path cannot be rescaled exactly; the message names the op that breaks homogeneity."""


@dataclass
class Region:
    """A homogeneous region: ``starts`` get their input scaled, ``ends`` (normalizations) compensate."""

    starts: list[str] = field(default_factory=list)
    ends: list[str] = field(default_factory=list)
    modules: set[str] = field(default_factory=set)
    amax: float | None = None


def homogeneous_region(graph: Graph, starts, bias_free) -> Region:
    """Close the region that scaling the inputs of ``starts`` scales, or raise :class:`NotHomogeneous`.

    ``bias_free(module_path) -> bool`` says whether a conv/matmul module has no bias. An additive op that
    mixes the region with an unscaled conv/matmul output pulls that conv in as another start.
    """
    nodes, cons, prod = graph.nodes, graph.consumers(), graph.producers()
    region = Region()
    start_set = set(starts)
    queue = deque(n for n in nodes if n.module in start_set and n.kind in START_KINDS)
    if not queue:
        raise NotHomogeneous(f"no conv/matmul of {sorted(start_set)} ran in the traced forward")
    entered_as_start = {n.index for n in queue}
    scaled: set[int] = set()
    members: dict[int, object] = {}
    end_nodes = []
    amaxes = []
    while queue:
        while queue:
            n = queue.popleft()
            if n.index in members:
                continue
            if n.kind in START_KINDS and not bias_free(n.module):
                raise NotHomogeneous(f"{n.module}:{n.op} has a bias, so scaling its input does not scale its output")
            members[n.index] = n
            scaled.update(n.outputs)
            if n.amax is not None:
                amaxes.append(n.amax)
            for t in n.outputs:
                if t in graph.outputs or t == graph.loss:
                    raise NotHomogeneous(f"{n.module}:{n.op} reaches the model output without a normalization")
                for ci in cons.get(t, []):
                    c = nodes[ci]
                    if c.kind == OpKind.NORM:
                        end_nodes.append(c)
                    elif c.kind in START_KINDS or c.op in _UNARY or c.op in _ALL_SCALED or c.op in _ONE_SCALED:
                        queue.append(c)
                    else:
                        raise NotHomogeneous(
                            f"{c.module}:{c.op} is not positively homogeneous (the path from {n.module} goes "
                            "through it before any normalization)"
                        )
        # pull in the unscaled conv/matmul outputs that additive ops mix into the region
        for m in list(members.values()):
            if m.op not in _ALL_SCALED:
                continue
            if len(m.inputs) < 2:
                raise NotHomogeneous(f"{m.module}:{m.op} adds a constant to the path")
            for t in m.inputs:
                if t in scaled:
                    continue
                p = _earliest_start(t, nodes, prod, bias_free)
                if p is None:
                    what = f"{nodes[prod[t]].module}:{nodes[prod[t]].op}" if t in prod else "an input of the model"
                    raise NotHomogeneous(f"{m.module}:{m.op} mixes the path with {what}, which is not rescaled")
                if p.index not in members:
                    entered_as_start.add(p.index)
                    queue.append(p)
    for m in members.values():
        if m.op in _ONE_SCALED or (m.kind in START_KINDS and m.index not in entered_as_start):
            if sum(t in scaled for t in m.inputs) > 1:
                raise NotHomogeneous(f"{m.module}:{m.op} multiplies two path tensors (degree 2, not homogeneous)")
    start_modules = {members[i].module for i in entered_as_start if i in members}
    inner_modules = {m.module for i, m in members.items() if i not in entered_as_start and m.kind in START_KINDS}
    both = start_modules & inner_modules
    if both:
        raise NotHomogeneous(f"{sorted(both)} run both on and off the scaled path (a shared module)")
    end_modules = {e.module for e in end_nodes}

    def fused_after_norm(n) -> bool:  # nn.BatchNorm(act=...)'s activation reads the normalization's own output
        src = prod.get(n.inputs[0]) if n.inputs else None
        return src is not None and nodes[src].module == n.module and nodes[src].kind == OpKind.NORM

    for n in nodes:
        if n.module in end_modules and n.kind == OpKind.NORM and not (n.inputs and n.inputs[0] in scaled):
            if fused_after_norm(n):
                continue
            raise NotHomogeneous(f"normalization {n.module} also runs on tensors outside the path")
    region.starts = sorted(start_modules)
    region.ends = sorted(end_modules)
    region.modules = {m.module for m in members.values()} | end_modules
    region.amax = max(amaxes) if amaxes else None
    return region


def _earliest_start(t: int, nodes, prod, bias_free):
    """The earliest bias-free conv/matmul from which tensor ``t`` is reached through homogeneous one-input ops
    (and further bias-free convs), or None: scaling its input scales ``t``."""
    found = None
    while t in prod:
        p = nodes[prod[t]]
        if p.kind in START_KINDS:
            if not bias_free(p.module):
                break
            found = p
        elif p.op not in _UNARY or len(p.inputs) != 1:
            break
        if not p.inputs:
            break
        t = p.inputs[0]
    return found


def shift_bits(amax: float | None, margin_bits: float) -> int:
    """k such that amax * 2^-k leaves at least ``margin_bits`` of float16 headroom (0 if it already does)."""
    if amax is None or amax <= 0 or not math.isfinite(amax):
        return 0
    return max(0, math.ceil(math.log2(amax / FP16_MAX) + margin_bits))


@register(Rescale)
def plan_rescale(ctx: PatchContext) -> Plan:
    plan = Plan()
    report = ctx.scan_report("policy 'rescale' finds the homogeneous region on the traced graph")
    graph = report.graph
    if graph is None:
        raise ConfigError("policy 'rescale' needs the traced graph: pass example_inputs (the report has no .graph)")
    if ctx.paths is not None:
        candidates = path_starts(ctx.paths)
    else:
        candidates = [p.start for p in report.risky if not p.protected]
    swaps = ctx.swaps

    def bias_free(path: str) -> bool:
        module = ctx.modules.get(path)
        return module is not None and not swaps.has_bias(module)

    done: set[str] = set()
    for start in candidates:
        if start in done:
            continue
        try:
            region = homogeneous_region(graph, [start], bias_free)
        except NotHomogeneous as exc:
            if ctx.paths is not None:
                raise
            plan.skipped[start] = str(exc)
            continue
        done.update(region.modules)
        bad_ends = [e for e in region.ends if not swaps.is_norm(ctx.modules.get(e))]
        if bad_ends or not region.ends:
            why = f"the ending normalization {bad_ends} cannot be compensated" if bad_ends else "no normalization"
            if ctx.paths is not None:
                raise NotHomogeneous(f"path from {start}: {why}")
            plan.skipped[start] = why
            continue
        bits = ctx.config.bits
        k = bits if bits is not None else shift_bits(region.amax, ctx.margin_bits)
        if k <= 0:
            plan.skipped[start] = f"already within float16 range with {ctx.margin_bits:g} bits of margin"
            continue
        members = region.starts + region.ends
        if not all(ctx.allowed(m, plan, kind="rescale_input") for m in members):
            plan.skipped.setdefault(start, "part of its region is excluded or already patched")
            continue
        scale = 2.0**-k
        for m in region.starts:
            plan.add(Change("rescale_input", m, f"input x 2^-{k} (region from {start})", {"scale": scale}))
        for m in region.ends:
            plan.add(Change("rescale_norm", m, f"compensates 2^-{k} (statistics and epsilon)", {"scale": scale}))
    return plan
