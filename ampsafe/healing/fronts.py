"""What a heal calls above its own layer, handed down by the front: ``scan`` finds the paths, ``patch`` islands them.

Why handed down: the healing layer sits below ``ampsafe.scanner`` and ``ampsafe.patching`` (they are the public
front, built on the same core), so it never imports them. The package ``ampsafe`` wires the pair here when it is
imported (``ampsafe/__init__.py``); a :class:`~ampsafe.healing.Healer` built with ``scan=`` / ``patch=`` uses
those instead.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

__all__ = ["HealFronts", "wire", "fronts"]


class HealFronts(NamedTuple):
    """``scan(model, inputs, *, level, target, margin_bits, loss_fn=None, loss_scale=None) -> ScanReport`` and
    ``patch(model, *, policy, level, paths) -> PatchReport``, as ``ampsafe.scan`` / ``ampsafe.patch``."""

    scan: Callable
    patch: Callable


_provider: Optional[Callable[[], HealFronts]] = None


def wire(provider: Callable[[], HealFronts]) -> None:
    """Set what :func:`fronts` returns: ``provider()`` is called at the first heal (it may import lazily)."""
    global _provider
    _provider = provider


def fronts() -> HealFronts:
    """The wired ``scan`` and ``patch``."""
    if _provider is None:  # pragma: no cover - ``import ampsafe`` always wires them
        raise RuntimeError("ampsafe's scan and patch are not wired into ampsafe.healing (import ampsafe first)")
    return HealFronts(*_provider())
