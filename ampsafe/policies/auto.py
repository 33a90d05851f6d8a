"""``auto`` (the default): protect what ``scan`` finds risky now, with the least change.

Risky ops with an exact rewrite (a logistic through ``exp``) are rewritten; other risky ops and every risky
path become FP32 islands (see :mod:`ampsafe.policies.island` for what a path's island covers). It protects only
what is risky when it runs: risk that appears later in training (on DBNet after 20-40 steps) needs ``island``
or ``convbn`` up front, or the scaler's ``on_floor="heal"``.
"""

from __future__ import annotations

from ..core.report import RiskPath
from . import Change, PatchContext, Plan, register
from .island import add_islands, island_modules
from .rewrite import logistic_rewrites

__all__ = ["plan_auto"]


@register("auto")
def plan_auto(ctx: PatchContext) -> Plan:
    plan = Plan()
    why: dict[str, str] = {}
    targets: list[str] = []
    if ctx.paths is not None:
        items, ops = list(ctx.paths), []
    else:
        report = ctx.scan_report("policy 'auto' patches what scan finds risky")
        items = [p for p in report.risky if not p.protected]
        ops = [o for o in report.risky_ops if not o.protected_by]
    rewritten: set[str] = set()
    for op in ops:
        module = ctx.modules.get(op.module)
        if module is not None and logistic_rewrites(type(module)):
            if ctx.allowed(op.module, plan, kind="rewrite"):
                plan.add(Change("rewrite", op.module, f"reciprocal(1 + exp(-z)) -> sigmoid(z) (risky {op.op})"))
            rewritten.add(op.module)
        else:
            targets.append(op.module)
            why.setdefault(op.module, f"FP32 island (risky op {op.op})")
    for item in items:
        mods = island_modules(item, ctx.level)
        targets += mods
        if isinstance(item, RiskPath):
            for m in mods:
                why.setdefault(m, f"FP32 island (risky path from {item.start})")
    add_islands(ctx, plan, [t for t in targets if t not in rewritten], why)
    return plan
