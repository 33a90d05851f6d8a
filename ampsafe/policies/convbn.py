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

from dataclasses import dataclass
from typing import Any

from ..core.modpath import join
from ..core.swaps import SwapMixin, swap
from ..errors import ConfigError, UnsupportedModelError
from . import Change, PatchContext, Plan, PolicyConfig, action, path_starts, register

__all__ = ["ConvBN", "ConvBNLayer", "ACTIVATIONS", "plan_convbn"]

ACTIVATIONS = ("gelu", "hardswish", "relu", "relu6", "silu")  # the act= names both adapters build


@dataclass(frozen=True)
class ConvBN(PolicyConfig):
    """``policy=ConvBN()`` (shorthand ``"convbn"``): a fresh BatchNorm after each unnormalized conv.

    ``act``: what follows the BatchNorm: None, a name from ``ACTIVATIONS``, a module or a module class.
    ``optimizers``: the optimizers that must not hold the model's parameters yet (an optimizer or a list,
    kept as a tuple); None checks every optimizer alive in the process.
    """

    name = "convbn"
    act: Any = None
    optimizers: Any = None

    def __post_init__(self):
        act = self.act
        known = act.lower() in ACTIVATIONS if isinstance(act, str) else act is None or callable(act)
        if not known:
            raise ConfigError(
                f"ConvBN.act must be None, one of {', '.join(ACTIVATIONS)}, a module or a module class, got {act!r}"
            )
        opts = self.optimizers
        if isinstance(opts, (str, bytes, dict)):
            raise ConfigError(f"ConvBN.optimizers must be None, an optimizer or a list of optimizers, got {opts!r}")
        if opts is not None and hasattr(opts, "__iter__"):
            object.__setattr__(self, "optimizers", tuple(opts))  # frozen and hashable


class ConvBNLayer(SwapMixin):
    """The mixin: conv -> ``self.bn`` (the framework's new BatchNorm) -> ``self.act`` (optional), written once
    for every framework (it only calls the base class's forward and two children); the conv keeps its own keys."""

    _ampsafe_protection = "convbn"
    _ampsafe_attrs = ("bn", "act")

    def forward(self, *args, **kwargs):
        out = self.bn(self._ampsafe_base.forward(self, *args, **kwargs))
        return self.act(out) if self.act is not None else out


@action("convbn", protection=ConvBNLayer._ampsafe_protection)
def swap_convbn(swaps, module, change: Change) -> None:
    swap(module, ConvBNLayer, bn=swaps.new_batch_norm(module), act=swaps.activation(change.params.get("act")))


@register(ConvBN)
def plan_convbn(ctx: PatchContext) -> Plan:
    swaps = ctx.swaps
    if swaps.is_distributed(ctx.outer):
        raise UnsupportedModelError(
            "policy 'convbn' adds BatchNorm parameters, which a model already wrapped in DistributedDataParallel "
            "would never synchronise: patch the bare model first, then wrap it"
        )
    holder = swaps.optimizer_holding(ctx.model, ctx.config.optimizers)
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
    act = ctx.config.act
    for path in dict.fromkeys(starts):
        module = ctx.modules.get(path)
        if module is not None and not swaps.is_conv(module):
            plan.skipped[path] = f"{type(module).__name__} is not a convolution (convbn normalizes convs only)"
            continue
        if ctx.allowed(path, plan, kind="convbn"):
            keys = join(path, "bn.*")
            plan.add(
                Change(
                    "convbn",
                    path,
                    f"conv + new BatchNorm{' + ' + str(act) if act else ''} (new keys {keys})",
                    {"act": act},
                )
            )
    return plan
