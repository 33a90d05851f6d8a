"""What the torch and Paddle patch adapters share: the framework-neutral mixins and the adapter base class.

Why: ``ConvBN`` and ``RescaledInput`` only call the base class's forward (and a child ``bn``/``act``, or a
constant factor), and turning a :class:`~ampsafe.policies.Change` into a class swap is one lookup of the action
its policy module registered (:func:`~ampsafe.policies.action`), the same for every framework. What is
framework-specific stays in ``ampsafe.torch.patch`` / ``ampsafe.paddle.patch``: the module types, the island's
float32 forward, the normalization statistics, the new BatchNorm, the optimizer's parameter lists.
"""

from __future__ import annotations

import gc

from ..errors import ConfigError
from . import Change, apply_change
from ._swap import SwapMixin

__all__ = ["ConvBN", "RescaledInput", "PatcherBase"]


class ConvBN(SwapMixin):
    """conv -> ``self.bn`` (new BatchNorm) -> ``self.act`` (optional); the conv keeps its own keys."""

    _ampsafe_protection = "convbn"
    _ampsafe_attrs = ("bn", "act")

    def forward(self, *args, **kwargs):
        out = self.bn(self._ampsafe_base.forward(self, *args, **kwargs))
        return self.act(out) if self.act is not None else out


class RescaledInput(SwapMixin):
    """Multiplies the first input by the constant ``_ampsafe_scale`` (a power of two) before the forward."""

    _ampsafe_protection = "rescale"
    _ampsafe_attrs = ("_ampsafe_scale",)

    def forward(self, x, *args, **kwargs):
        return self._ampsafe_base.forward(self, x * self._ampsafe_scale, *args, **kwargs)


class PatcherBase:
    """The adapter predicates the policies read and :meth:`apply`, the module swaps ``ampsafe.patching`` makes.

    Subclasses set the class attributes below and implement ``modules``, ``is_distributed``, ``save_buffers``,
    ``new_batch_norm(conv)`` and ``optimizer_params(optimizer)``.
    """

    framework = ""
    convs: tuple = ()  # convolution module types (convbn targets)
    norms: tuple = ()  # normalization module types (rescale_norm targets)
    eps_attr = "eps"  # the normalization's epsilon attribute
    island: type = SwapMixin  # the FP32 island mixin
    rescaled_norm: type = SwapMixin  # the normalization mixin compensating a rescaled input
    module_type: type = object  # an ``act=`` of this type is used as given
    module_label = ""  # how the error message names module_type
    optimizer_type: type = object
    activations: dict = {}  # ``act=`` name -> module class

    def is_conv(self, module) -> bool:
        return isinstance(module, self.convs)

    def has_bias(self, module) -> bool:
        return getattr(module, "bias", None) is not None

    def is_norm(self, module) -> bool:
        return isinstance(module, self.norms) and hasattr(module, self.eps_attr)

    def optimizer_holding(self, model, optimizers=None):
        """The first optimizer (given, or alive anywhere in the process) that holds a parameter of ``model``."""
        ids = {id(p) for p in model.parameters()}
        if optimizers is None:
            optimizers = [o for o in gc.get_objects() if issubclass(type(o), self.optimizer_type)]
        elif isinstance(optimizers, self.optimizer_type):
            optimizers = [optimizers]
        for opt in optimizers:
            if any(id(p) in ids for p in self.optimizer_params(opt)):
                return opt
        return None

    def apply(self, module, change: Change) -> None:
        """Swap ``module`` as ``change`` says, through the action registered for ``change.kind``."""
        apply_change(self, module, change)

    def activation(self, act):
        """The ``act=`` of a convbn patch as a module: None, a module, a name from ``activations``, or a class."""
        if act is None or isinstance(act, self.module_type):
            return act
        if isinstance(act, str):
            if act.lower() not in self.activations:
                raise ConfigError(f"act must be one of {sorted(self.activations)} or {self.module_label}, got {act!r}")
            return self.activations[act.lower()]()
        return act()

    def new_batch_norm(self, conv):  # pragma: no cover - adapters
        raise NotImplementedError

    def optimizer_params(self, optimizer):  # pragma: no cover - adapters
        raise NotImplementedError
