"""``convbn``: a fresh BatchNorm after each unnormalized conv, the fix the DBNet user report arrived at.

The conv stays where it is with its own keys (``<conv>.weight``, ``<conv>.bias``); the new normalization
is its child ``<conv>.bn`` (new keys ``<conv>.bn.weight/bias`` plus running statistics:
``running_mean/running_var/num_batches_tracked`` in torch, ``_mean/_variance`` in Paddle), applied to the
conv's output (PaddleOCR ``ConvBNLayer`` semantics: conv, BatchNorm, optional ``act``). This changes the
function, so it is for training from scratch or re-training. It is refused for a DDP-wrapped model or one
whose parameters an optimizer already holds: the new BatchNorm parameters would never be trained or synced.
Patch first, then build the optimizer and wrap the model.
"""

from __future__ import annotations

from ..errors import UnsupportedModelError
from . import Change, PatchContext, Plan, path_starts, register

__all__ = ["plan_convbn"]


@register("convbn", options=("optimizers", "act"))
def plan_convbn(ctx: PatchContext) -> Plan:
    adapter = ctx.adapter
    if adapter.is_distributed(ctx.outer):
        raise UnsupportedModelError(
            "policy 'convbn' adds BatchNorm parameters, which a model already wrapped in DistributedDataParallel "
            "would never synchronise: patch the bare model first, then wrap it"
        )
    holder = adapter.optimizer_holding(ctx.model, ctx.options.get("optimizers"))
    if holder is not None:
        raise UnsupportedModelError(
            f"policy 'convbn' adds BatchNorm parameters, but an optimizer ({type(holder).__name__}) already holds "
            "this model's parameters and would never train them: patch first, then build the optimizer"
        )
    plan = Plan()
    if ctx.paths is not None:
        starts = path_starts(ctx.paths)
    else:
        report = ctx.scan_report("policy 'convbn' normalizes the unnormalized convs scan finds")
        starts = [p.start for p in report.paths if not p.normalized and not p.protected]
    act = ctx.options.get("act")
    for path in dict.fromkeys(starts):
        module = ctx.modules.get(path)
        if module is not None and not adapter.is_conv(module):
            plan.skipped[path] = f"{type(module).__name__} is not a convolution (convbn normalizes convs only)"
            continue
        if ctx.allowed(path, plan, kind="convbn"):
            keys = f"{path}.bn.*" if path else "bn.*"
            plan.add(
                Change(
                    "convbn",
                    path,
                    f"conv + new BatchNorm{' + ' + str(act) if act else ''} (new keys {keys})",
                    {"act": act},
                )
            )
    return plan
