"""``island``: make every unnormalized path, and every risky one, compute in float32 under autocast.

A path is islanded as a whole: its starting conv/matmul *and* the modules that consume it
(``RiskPath.layers``). Islanding only the conv fails: the next autocast op casts its float32 output straight
back to float16 (1e5 -> inf). At ``O1`` the functional ops between those modules (``add``, ``interpolate``,
``concat``) follow their inputs' dtype, so they stay float32 without islanding the module that owns them; at
``O2`` almost every op is cast to float16, so the owners of the path's functional ops (``RiskPath.ops``) are
islanded too, which may be an enclosing module such as DBNet's ``neck`` or the root (the whole model in
float32). So at O1 a layer of the path that encloses other layers of it (it only owns the functional ops
between them) is left alone; at O2 it is islanded and nested targets collapse to the outermost one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.modpath import outermost, under
from ..core.report import RiskPath
from ..core.swaps import protection_of, swap
from . import Change, PatchContext, Plan, PolicyConfig, action, register

__all__ = ["Island", "island_modules", "outermost", "plan_island"]


@dataclass(frozen=True)
class Island(PolicyConfig):
    """``policy=Island()`` (shorthand ``"island"``): every unnormalized and every risky path in float32."""

    name = "island"


@action("island", protection="island")
def swap_island(swaps, module, change: Change) -> None:
    swap(module, swaps.island)  # the framework's float32 mixin


def island_modules(item, level: str) -> list[str]:
    """Module paths to island for one path (a RiskPath, or a module path given explicitly)."""
    if not isinstance(item, RiskPath):
        return [str(item)]
    mods = list(dict.fromkeys(item.layers or (item.start,)))
    if level == "O2":
        return list(dict.fromkeys(mods + [op.rsplit(":", 1)[0] for op in item.ops if ":" in op]))
    # O1: a layer that only owns functional ops between the others (an enclosing module) stays as it is
    return [m for m in mods if m == item.start or not any(o != m and under(o, m) for o in mods)]


def _inside_island(path: str, modules: dict) -> bool:
    return any(protection_of(m) == "island" and under(path, q) and q != path for q, m in modules.items())


def add_islands(ctx: PatchContext, plan: Plan, targets: list[str], why: dict[str, str]) -> None:
    for path in outermost(targets):
        if _inside_island(path, ctx.modules):
            continue  # an enclosing island already covers it
        if ctx.allowed(path, plan, kind="island"):
            plan.add(Change("island", path, why.get(path, "FP32 island")))


@register(Island)
def plan_island(ctx: PatchContext) -> Plan:
    plan = Plan()
    why: dict[str, str] = {}
    targets: list[str] = []
    if ctx.paths is not None:
        items = list(ctx.paths)
    else:
        report = ctx.scan_report("policy 'island' islands the paths scan finds")
        items = [p for p in report.paths if (not p.normalized or p.risky) and not p.protected]
        for op in report.risky_ops:
            if not op.protected_by:
                targets.append(op.module)
                why.setdefault(op.module, f"FP32 island (risky op {op.op})")
    for item in items:
        mods = island_modules(item, ctx.level)
        targets += mods
        if isinstance(item, RiskPath):
            reason = "risky" if item.risky else "unnormalized"
            for m in mods:
                why.setdefault(m, f"FP32 island ({reason} path from {item.start})")
    add_islands(ctx, plan, targets, why)
    return plan
