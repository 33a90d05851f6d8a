"""Class swapping: how every ampsafe patch changes a module without changing its parameters or their names.

A patched module keeps its identity, its parameters and its place in the tree; only its class becomes a
subclass ``Mixin[Base]`` whose methods (``forward``, a rewritten ``step_function``...) wrap the base class's.
So ``state_dict`` keys, ``named_parameters`` names and parameter objects (hence optimizer state) stay exactly
as they were, and ``unpatch`` is one assignment back to the base class plus deleting the attributes the patch
added. The swapped classes are built once per (mixin, base) pair and pickle through :func:`_rebuild`, so
``torch.save(model)``, ``copy.deepcopy`` and ``pickle`` work without the dynamic class being importable.

Framework-neutral: works for ``torch.nn.Module`` and ``paddle.nn.Layer`` alike.
"""

from __future__ import annotations

__all__ = ["SwapMixin", "swap", "unswap", "swapped_class", "base_class", "protection_of"]

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


def base_class(module) -> type:
    """The module's original class (its own class when unpatched)."""
    return getattr(type(module), "_ampsafe_base", type(module))


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
