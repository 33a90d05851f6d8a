"""Every attribute ampsafe sets on another library's object, in one process-wide ledger, and put back exactly.

Who patches: ``ampsafe run``'s child (:mod:`ampsafe.run.installer` and the framework hooks it installs: scalers, the
FP32 guard, target checks, trainer integrations), Paddle's op interception (:mod:`ampsafe.paddle.intercept`),
the two float16 emulators and torch's per-instance call hooks (:mod:`ampsafe.torch.callhooks`). Each holds its
own :class:`AttrPatches` (a party, named) and undoes its own patches at its own time, but every patch is
recorded in the one ledger, for two reasons:

* two parties may patch the same attribute, and undo in any order. Undoing the older patch first must not put
  its original back over the newer one: the newer patch is handed that original, and puts it back when it is
  undone itself. Only a ledger that sees both can do that;
* "put back" restores an inherited attribute by deleting the one that shadowed it, not by copying the inherited
  value onto the subclass (which would pin it there, hiding a later change of the base class).

:func:`live` lists what is patched now, whoever patched it (tests check that an uninstall leaves nothing).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

__all__ = ["AttrPatches", "live"]

_lock = threading.RLock()
# (id(owner), attribute) -> the patches in force on it, oldest first (each holds its owner: the id stays valid)
_in_force: dict[tuple[int, str], list[_Patch]] = {}
_counter = [0]  # the order patches were made in, for live()


class _Patch:
    """One ``setattr``: what was there before (``saved``; ``own``: held in the owner's own ``__dict__``)."""

    __slots__ = ("owner", "attr", "saved", "own", "party", "order")

    def __init__(self, owner, attr: str, party: AttrPatches) -> None:
        self.owner, self.attr, self.party = owner, attr, party
        self.saved, self.own = getattr(owner, attr), attr in vars(owner)
        _counter[0] += 1
        self.order = _counter[0]


class AttrPatches:
    """One party's patches (``name`` says whose): :meth:`set` records a ``setattr`` in the process ledger,
    :meth:`on_restore` an undo step of another kind; :meth:`restore` undoes this party's, newest first
    (idempotent: the party can patch again afterwards)."""

    # The ledger's one re-entrant lock, for a party that keeps a record of its own beside its patches (callhooks'
    # hooked instances): guarding that record with a second lock, taken before this one, could deadlock with a
    # thread that holds this one when a weakref callback or the garbage collector runs the party's code.
    lock = _lock

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._steps: list[_Patch | Callable[[], Any]] = []

    def set(self, owner, attr: str, value) -> None:
        """``setattr(owner, attr, value)``, undone by :meth:`restore`."""
        with _lock:
            patch = _Patch(owner, attr, self)
            _in_force.setdefault((id(owner), attr), []).append(patch)
            self._steps.append(patch)
            setattr(owner, attr, value)

    def wrap(self, owner, attr: str, make: Callable[[Callable], Callable], *, mark: str) -> bool:
        """Replace ``owner.attr`` by ``make(original)`` (``functools.wraps``'ed, with attribute ``mark`` set true),
        once: a missing attribute, or one already marked (wrapped before, here or on a base class), is left alone.
        Whether it wrapped."""
        original = getattr(owner, attr, None)
        if original is None or getattr(original, mark, False):
            return False
        wrapped = functools.wraps(original)(make(original))
        setattr(wrapped, mark, True)
        self.set(owner, attr, wrapped)
        return True

    def undo(self, owner, attr: str) -> bool:
        """Undo this party's latest patch of ``owner.attr`` alone, its other patches staying in force (a patch
        whose life is not the party's: ``callhooks`` patches a class while it has hooked instances). Whether
        there was one."""
        with _lock:
            for at in range(len(self._steps) - 1, -1, -1):
                step = self._steps[at]
                if isinstance(step, _Patch) and step.owner is owner and step.attr == attr:
                    del self._steps[at]
                    _undo(step)
                    return True
            return False

    def on_restore(self, undo: Callable[[], Any]) -> None:
        """Call ``undo()`` when :meth:`restore` reaches this point (an emulator to uninstall, a hook to remove)."""
        with _lock:
            self._steps.append(undo)

    def restore(self) -> None:
        """Undo this party's patches and steps, newest first. A step that raises does not stop the others; the
        first error is raised at the end."""
        errors: list[BaseException] = []
        while True:
            with _lock:
                if not self._steps:
                    break
                step = self._steps.pop()
                if isinstance(step, _Patch):
                    _undo(step)
                    continue
            try:  # outside the ledger's lock: an emulator's uninstall takes its own lock, then the ledger's
                step()
            except Exception as exc:  # noqa: BLE001 - raised below, once everything else is back
                errors.append(exc)
        if errors:
            raise errors[0]

    def __bool__(self) -> bool:
        return bool(self._steps)

    def __repr__(self) -> str:
        return f"AttrPatches({self.name!r}, {len(self._steps)} in force)"


def _undo(patch: _Patch) -> None:
    key = (id(patch.owner), patch.attr)
    stack = _in_force[key]
    at = next(i for i, p in enumerate(stack) if p is patch)
    del stack[at]
    if at < len(stack):  # patched over since (by another party): that patch now puts this one's original back
        newer = stack[at]
        newer.saved, newer.own = patch.saved, patch.own
    elif patch.own:
        setattr(patch.owner, patch.attr, patch.saved)
    else:
        delattr(patch.owner, patch.attr)
    if not stack:
        del _in_force[key]


def live() -> list[tuple[str, object, str]]:
    """(party name, owner, attribute) of every patch in force, oldest first."""
    with _lock:
        patches = sorted((p for stack in _in_force.values() for p in stack), key=lambda p: p.order)
        return [(p.party.name, p.owner, p.attr) for p in patches]
