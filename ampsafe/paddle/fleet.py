"""Paddle fleet: ``fleet.distributed_scaler(scaler)`` outside pure data parallel (sharding, tensor or pipeline
parallel) assigns ``scaler._unscale = MethodType(...)`` on the instance. On a plain class that shadows the
scaler's own ``_unscale``; on ampsafe's GradScaler ``_unscale`` is a :class:`KeptMethod`, a data descriptor, so
the assignment is kept aside in the instance's ``__dict__`` and the scaler's own method, with its floor, cap and
heal, still answers. What fleet's replacement adds is done by the scaler itself: it unscales a parameter's
``main_grad`` when the parameter has one (:mod:`ampsafe.paddle.grads`) and agrees ``found_inf`` over every rank.
Not covered: sharding stage 1 with ``comm_overlap``, whose replacement also waits for the optimizer's comm buffers.
"""

from __future__ import annotations

from types import MethodType
from typing import Any, Callable

__all__ = ["KeptMethod", "assigned"]


class KeptMethod:
    """A method that an assignment on the instance does not shadow: the assigned value is kept in the instance's
    ``__dict__`` under the method's name (:func:`assigned` reads it back; pickling leaves it behind, as it leaves
    every instance-level wrapper of a method) and the class's method is what ``obj.<name>`` keeps giving."""

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.__doc__ = fn.__doc__
        self.name = fn.__name__

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None):
        return self.fn if obj is None else MethodType(self.fn, obj)

    def __set__(self, obj, value) -> None:
        obj.__dict__[self.name] = value

    def __delete__(self, obj) -> None:
        obj.__dict__.pop(self.name, None)


def assigned(obj, name: str) -> Any:
    """What was assigned to ``obj.<name>`` over a :class:`KeptMethod` (fleet's ``_unscale``), or None."""
    return obj.__dict__.get(name)
