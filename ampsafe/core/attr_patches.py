"""Attributes set on other libraries' objects, and put back exactly: the emulators' patches of torch and Paddle.

Why one class: "put back" must restore an inherited attribute by deleting the one that shadowed it, not by
copying the inherited value onto the subclass, and both emulators need that rule.
"""

from __future__ import annotations

__all__ = ["AttrPatches"]


class AttrPatches:
    """A stack of ``setattr`` calls that :meth:`restore` undoes in reverse order (idempotent)."""

    def __init__(self) -> None:
        self._saved: list[tuple[object, str, object, bool]] = []

    def set(self, owner, attr: str, value) -> None:
        self._saved.append((owner, attr, getattr(owner, attr), attr in vars(owner)))
        setattr(owner, attr, value)

    def restore(self) -> None:
        while self._saved:
            owner, attr, value, own = self._saved.pop()
            if own:
                setattr(owner, attr, value)
            else:
                delattr(owner, attr)

    def __bool__(self) -> bool:
        return bool(self._saved)
