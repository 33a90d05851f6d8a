"""Class swapping, and the part of a :class:`~ampsafe.core.backend.Backend` the patch policies read: ``backend.swaps``.

Every ampsafe patch changes a module without changing its parameters or their names. A patched module keeps its
identity, its parameters and its place in the tree; only its class becomes a subclass ``Mixin[Base]`` whose
methods (``forward``, a rewritten ``step_function``...) wrap the base class's. So ``state_dict`` keys,
``named_parameters`` names and parameter objects (hence optimizer state) stay exactly as they were, and
``unpatch`` is one assignment back to the base class plus deleting the attributes the patch added. The swapped
classes are built once per (mixin, base) pair and pickle through :func:`_rebuild`, so ``torch.save(model)``,
``copy.deepcopy`` and ``pickle`` work without the dynamic class being importable.

:class:`Swaps` lists what a framework tells the policies about its modules (which are convolutions and
normalizations, its float32-island and rescaled-normalization mixins, how to build a BatchNorm for a conv);
:class:`SwapsBase` answers every question that follows from those facts, once for all frameworks. What is a
Backend fact (module paths, parameters, optimizer parameter lists, a state snapshot) stays the Backend's.

Framework-neutral: works for ``torch.nn.Module`` and ``paddle.nn.Layer`` alike, and imports neither.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..errors import ConfigError
from .live_objects import live_objects

__all__ = ["SwapMixin", "swap", "unswap", "swapped_class", "protection_of", "Swaps", "SwapsBase"]

_CLASSES: dict[tuple[type, type], type] = {}


class SwapMixin:
    """Base of every patch mixin. ``_ampsafe_protection`` names the policy; ``_ampsafe_attrs`` lists the
    instance attributes the patch adds (deleted on unpatch)."""

    _ampsafe_protection: str = ""
    _ampsafe_attrs: tuple[str, ...] = ()
    _ampsafe_base: type = object
    _ampsafe_mixin: type = object

    @classmethod
    def class_namespace(cls, base: type) -> dict:
        """Extra class attributes of ``Mixin[base]`` (e.g. rewritten methods); none by default."""
        return {}

    def __reduce_ex__(self, protocol):
        # Rebuild through the (mixin, base) pair: the dynamic class itself is not importable by name.
        return _rebuild, (type(self)._ampsafe_mixin, type(self)._ampsafe_base), self.__getstate__()

    def _ampsafe_restore(self) -> None:
        """Hook for a mixin to undo instance changes beyond deleting its attributes (default: nothing)."""


def _rebuild(mixin: type, base: type):
    cls = swapped_class(mixin, base)
    return cls.__new__(cls)


def swapped_class(mixin: type, base: type) -> type:
    """The cached class ``Mixin[Base]``: ``mixin`` first in the MRO, then ``base``."""
    key = (mixin, base)
    cls = _CLASSES.get(key)
    if cls is None:
        namespace = {
            "_ampsafe_base": base,
            "_ampsafe_mixin": mixin,
            "__module__": mixin.__module__,
            **mixin.class_namespace(base),
        }
        cls = type(f"{mixin.__name__}[{base.__name__}]", (mixin, base), namespace)
        cls.__qualname__ = cls.__name__
        _CLASSES[key] = cls
    return cls


def protection_of(module) -> str | None:
    """The policy that patched ``module`` ("island", "convbn", "rescale", "rewrite"), or None."""
    return getattr(type(module), "_ampsafe_protection", None) or None


def swap(module, mixin: type, **attrs) -> None:
    """Turn ``module`` into a ``mixin[type(module)]`` and set the patch's instance attributes.

    Attributes are set only after the class swap succeeded; if setting one fails, the swap is undone, so a
    failure leaves the module exactly as it was.
    """
    if protection_of(module):
        raise RuntimeError(f"{type(module).__name__} is already patched ({protection_of(module)})")
    base = type(module)
    module.__class__ = swapped_class(mixin, base)
    try:
        for name, value in attrs.items():
            setattr(module, name, value)
    except BaseException:
        unswap(module)
        raise


def unswap(module) -> None:
    """Undo :func:`swap`: delete the added attributes and give the module its original class back."""
    cls = type(module)
    if not protection_of(module):
        return
    module._ampsafe_restore()
    for name in cls._ampsafe_attrs:
        try:
            delattr(module, name)
        except AttributeError:
            pass
    module.__class__ = cls._ampsafe_base


class Swaps(Protocol):
    """``backend.swaps``: the module facts of one framework that the patch policies need, each stated once."""

    convs: tuple  # convolution module types (convbn targets)
    norms: tuple  # normalization module types (rescale_norm targets)
    eps_attr: str  # the normalization's epsilon attribute
    island: type  # the float32 island mixin (a SwapMixin)
    rescaled_norm: type  # the normalization mixin compensating a rescaled input (a SwapMixin)
    optimizer_type: type  # the framework's optimizer base class
    activations: dict  # ``act=`` name -> module class
    module_label: str  # how an error message names the framework's module type ("an nn.Module")

    def is_conv(self, module) -> bool: ...

    def is_norm(self, module) -> bool:
        """A normalization whose epsilon :attr:`eps_attr` names (so a rescale can compensate it)."""

    def has_bias(self, module) -> bool: ...

    def is_distributed(self, model) -> bool:
        """Whether ``model`` is the framework's data-parallel wrapper (its parameters synced by it)."""

    def optimizer_holding(self, model, optimizers=None):
        """The first optimizer (given, or alive anywhere in the process) holding a parameter of ``model``."""

    def activation(self, act):
        """``act=`` of a convbn patch as a module: None, a module, a name from :attr:`activations`, or a class."""

    def new_batch_norm(self, conv):
        """A fresh BatchNorm for the conv's output, in the conv's train mode."""


class SwapsBase:
    """The :class:`Swaps` members that follow from a framework's facts, written once. A subclass (the framework's
    ``patch.py``) sets the class attributes and implements ``is_distributed`` and ``new_batch_norm``; ``backend``
    is its Backend, asked for what it already knows (the module type, an optimizer's parameters)."""

    convs: tuple = ()
    norms: tuple = ()
    eps_attr = "eps"
    island: type = SwapMixin
    rescaled_norm: type = SwapMixin
    optimizer_type: type = object
    activations: dict = {}
    module_label = ""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    def is_conv(self, module) -> bool:
        return isinstance(module, self.convs)

    def is_norm(self, module) -> bool:
        return isinstance(module, self.norms) and hasattr(module, self.eps_attr)

    def has_bias(self, module) -> bool:
        return getattr(module, "bias", None) is not None

    def optimizer_holding(self, model, optimizers=None):
        ids = {id(p) for p in self.backend.parameters(model)}
        if optimizers is None:
            optimizers = live_objects(self.optimizer_type)
        elif isinstance(optimizers, self.optimizer_type):
            optimizers = [optimizers]
        for opt in optimizers:
            if any(id(p) in ids for p in self.backend.optimizer_params(opt)):
                return opt
        return None

    def activation(self, act):
        if act is None or isinstance(act, self.backend.module_type):
            return act
        if isinstance(act, str):
            if act.lower() not in self.activations:
                raise ConfigError(f"act must be one of {sorted(self.activations)} or {self.module_label}, got {act!r}")
            return self.activations[act.lower()]()
        return act()

    def is_distributed(self, model) -> bool:  # pragma: no cover - adapters
        raise NotImplementedError

    def new_batch_norm(self, conv):  # pragma: no cover - adapters
        raise NotImplementedError
