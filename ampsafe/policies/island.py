"""``island``: make every unnormalized path, and every risky one, compute in float32 under autocast.

A path is islanded as a whole: its starting conv/matmul *and* the modules that consume it
(``RiskPath.layers``). Islanding only the conv fails: the next autocast op casts its float32 output straight
back to float16 (1e5 -> inf). At ``O2`` almost every op is cast to float16, so the owners of the path's
functional ops (``RiskPath.ops``) are islanded too, which may be an enclosing module such as DBNet's ``neck``.

A layer of the path that encloses other layers of it (a container whose own forward runs an op of the path
between its members, as SVTRNet's transpose/reshape between ``blocks2`` and ``sub_sample2``) is islanded whole
only when an op of the path that it runs in its own forward needs float32 (:func:`needs_float32`): one that
computes in float16 at the level, so it could overflow on the path's values. An op that only moves data
(reshape, transpose, flatten, concat, split, ...) follows its input's dtype at every level and cannot grow a
value, so a container that runs only such ops between its members is left alone and its members on the path
are islanded. At O1 the elementwise ops (``add``, ``interpolate``) follow their inputs' dtype too, so only a
conv/matmul of autocast's float16 list makes a container an island; at O2 any op that computes does (nested
targets then collapse to the outermost one). The path's starting module is always islanded.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from ..core.graph import OpKind
from ..core.modpath import outermost, under
from ..core.scan_report import RiskOp, RiskPath
from ..core.sentinel import MOVEMENT_OPS
from ..core.swaps import protection_of, swap
from . import Change, PatchContext, Plan, PolicyConfig, action, register

__all__ = ["Island", "island_modules", "needs_float32", "outermost", "plan_island", "DATA_MOVEMENT_OPS"]


@dataclass(frozen=True)
class Island(PolicyConfig):
    """``policy=Island()`` (shorthand ``"island"``): every unnormalized and every risky path in float32."""

    name = "island"


@action("island", protection="island")
def swap_island(swaps, module, change: Change) -> None:
    swap(module, swaps.island)  # the framework's float32 mixin


# ops that only move data (both tracers' canonical names): their output holds their input's values, in its dtype;
# a cast is not one of them (a cast to float16 is where a float32 value overflows)
DATA_MOVEMENT_OPS = (MOVEMENT_OPS - {"to", "cast", "float", "half", "bfloat16", "double", "type_as"}) | {
    "strided_slice",
    "split_with_num",
    "split_with_sizes",
    "expand_as",
    "view_as",
    "alias",
    "lift_fresh",
}


def needs_float32(op: str, level: str, backend=None) -> bool:
    """Whether the canonical ``op`` on a risky path must run in float32 for the island to hold: not an op that
    only moves data; at O2 every other op (almost all run in float16 there); at O1 an op autocast runs in float16
    even on float32 inputs (its float16 list, conv/matmul; CUDA's list, the wider one: the scan's target is not
    known here). Without a ``backend`` at O1 no op of a container's own forward counts (only the start does)."""
    if op in DATA_MOVEMENT_OPS:
        return False
    if level == "O2":
        return True
    return backend is not None and bool(backend.amp.runs_low(op, OpKind.OTHER, [False], level=level, target="cuda"))


def island_modules(item, level: str, backend=None) -> list[str]:
    """Module paths to island for one path (a RiskPath, or a module path given explicitly): its layers (at O2
    also the owners of its ops), where a layer enclosing other layers of the path is kept only when it is the
    start or runs an op of the path that :func:`needs_float32` in its own forward (else its members stand)."""
    if not isinstance(item, RiskPath):
        return [str(item)]
    mods = list(dict.fromkeys(item.layers or (item.start,)))
    own: dict[str, list[str]] = {}  # module -> the path's ops its own forward runs
    for label in item.ops:
        if ":" in label:
            module, _, op = label.rpartition(":")
            own.setdefault(module, []).append(op)
    if level == "O2":
        mods = list(dict.fromkeys(mods + list(own)))

    def whole(m: str) -> bool:
        return m == item.start or any(needs_float32(op, level, backend) for op in own.get(m, ()))

    return [m for m in mods if whole(m) or not any(o != m and under(o, m) for o in mods)]


def _inside_island(path: str, modules: dict) -> bool:
    return any(protection_of(m) == "island" and under(path, q) and q != path for q, m in modules.items())


@dataclass
class IslandTargets:
    """The modules a plan islands, each with the first reason given for it, gathered from risky ops and paths.

    ``auto`` and ``island`` differ in what they gather, not in how a gathered module becomes a change.
    """

    modules: list[str] = field(default_factory=list)
    why: dict[str, str] = field(default_factory=dict)

    def add_op(self, op: RiskOp) -> None:
        self.modules.append(op.module)
        self.why.setdefault(op.module, f"FP32 island (risky op {op.op})")

    def add_path(self, ctx: PatchContext, item, reason: str | None = None) -> None:
        """The island modules of ``item`` (see :func:`island_modules`); ``reason`` names a RiskPath in the
        change's reason (default: "risky" or "unnormalized", whichever it is)."""
        mods = island_modules(item, ctx.level, ctx.backend)
        self.modules += mods
        if isinstance(item, RiskPath):
            reason = reason or ("risky" if item.risky else "unnormalized")
            for m in mods:
                self.why.setdefault(m, f"FP32 island ({reason} path from {item.start})")

    def plan(self, ctx: PatchContext, plan: Plan, skip: Collection[str] = ()) -> None:
        """Add an island change for each outermost module (but those in ``skip``) no enclosing island covers."""
        for path in outermost([m for m in self.modules if m not in skip]):
            if _inside_island(path, ctx.modules):
                continue  # an enclosing island already covers it
            if ctx.allowed(path, plan, kind="island"):
                plan.add(Change("island", path, self.why.get(path, "FP32 island")))


@register(Island)
def plan_island(ctx: PatchContext) -> Plan:
    plan, islands = Plan(), IslandTargets()
    if ctx.paths is not None:
        items = list(ctx.paths)
    else:
        report = ctx.scan_report("policy 'island' islands the paths scan finds")
        items = [p for p in report.paths if (not p.normalized or p.risky) and not p.protected]
        for op in report.risky_ops:
            if not op.protected_by:
                islands.add_op(op)
    for item in items:
        islands.add_path(ctx, item)
    islands.plan(ctx, plan)
    return plan
