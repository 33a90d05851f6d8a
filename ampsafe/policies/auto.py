"""``auto`` (the default): protect what ``scan`` finds risky now, with the least change.

Risky ops with an exact rewrite (a logistic through ``exp``) are rewritten; other risky ops and every risky
path become FP32 islands (see :mod:`ampsafe.policies.island` for what a path's island covers). It protects only
what is risky when it runs: risk that appears later in training (on DBNet after 20-40 steps) needs ``island``
or ``convbn`` up front, or the scaler's ``on_floor="heal"``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from ..errors import ConfigError
from . import Change, PatchContext, Plan, PolicyConfig, register
from .island import IslandTargets
from .rewrite import logistic_rewrites

__all__ = ["Auto", "plan_auto"]


@dataclass(frozen=True)
class Auto(PolicyConfig):
    """``policy=Auto()`` (shorthand ``"auto"``, the default). ``margin_bits``: a path or op with less float16
    headroom than this is risky, so patched (the scan's margin; ``patch(margin_bits=)`` sets the same)."""

    name = "auto"
    margin_bits: float = 4.0

    def __post_init__(self):
        m = self.margin_bits
        if isinstance(m, bool) or not isinstance(m, numbers.Real) or not math.isfinite(m) or m < 0:
            raise ConfigError(f"Auto.margin_bits must be a finite number >= 0, got {m!r}")


@register(Auto)
def plan_auto(ctx: PatchContext) -> Plan:
    plan, islands = Plan(), IslandTargets()
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
            islands.add_op(op)
    for item in items:
        islands.add_path(ctx, item, reason="risky")
    islands.plan(ctx, plan, skip=rewritten)
    return plan
