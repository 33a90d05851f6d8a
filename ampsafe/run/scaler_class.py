"""The classes ``ampsafe run`` puts in place of a framework's GradScaler: ampsafe's scaler with the run's floor.

Why a class and not a patched instance: scripts build their scaler from the name they imported
(``torch.amp.GradScaler(...)``), and libraries check ``isinstance(scaler, torch.amp.GradScaler)``. The class
takes the script's own arguments plus the run's floor as defaults (the script's win), tells the run about each
scaler built and each checkpoint reload, and answers ``isinstance`` for the class it replaced (:class:`Alias`).
"""

from __future__ import annotations

from typing import Callable

__all__ = ["Alias", "with_floor", "shim", "SHIM_MODULE"]

SHIM_MODULE = "ampsafe.auto"  # the module the run's scaler subclasses claim: what a script sees as their type


class Alias(type):
    """The metaclass of the classes ``ampsafe run`` puts in place of a framework's scaler class: ``isinstance`` /
    ``issubclass`` against the patched name also answer as against the class it replaced (``_replaces``), so a
    scaler the framework or a library built before (or ampsafe's own, built directly) still passes a library's
    ``isinstance(scaler, torch.amp.GradScaler)`` check."""

    _replaces: type | None = None

    def __instancecheck__(cls, obj) -> bool:
        return type.__instancecheck__(cls, obj) or (cls._replaces is not None and isinstance(obj, cls._replaces))

    def __subclasscheck__(cls, sub) -> bool:
        return type.__subclasscheck__(cls, sub) or (cls._replaces is not None and issubclass(sub, cls._replaces))


def _mapped(args: tuple, kwargs: dict, map_device: Callable) -> tuple:
    """--emulate-fp16: a "cuda" scaler scales on the device ``map_device`` names (the CPU)."""
    if args:
        return (map_device(args[0]), *args[1:])
    kwargs["device"] = map_device(kwargs.get("device", "cuda"))
    return args


def with_floor(
    base: type,
    framework: str,
    defaults: dict,
    *,
    scale: Callable,
    guards: Callable,
    steps: tuple[str, ...],
    built: Callable,
    reloaded: Callable,
    map_device: Callable | None = None,
    replaces: type | None = None,
) -> type:
    """``base`` (ampsafe's scaler of ``framework``) with ``ampsafe run``'s floor as default keyword arguments
    (``defaults``; the script's own arguments win). The framework says what only it knows: ``scale(scaler)`` its
    current scale, ``guards(scaler)`` whether it checks its optimizer's gradients itself, ``steps`` the methods
    inside which the optimizer steps are the scaler's (the FP32 guard lets them through), ``map_device`` the device
    a "cuda" scaler really scales on (``--emulate-fp16``). ``replaces``: the framework class it stands for
    (``isinstance`` against it still holds, see :class:`Alias`). The run hears of each scaler
    (``built(scaler, framework, script_kwargs)``) and each checkpoint reload (``reloaded(scaler, scale_before)``)."""

    class GradScaler(base, metaclass=Alias):
        def __init__(self, *args, **kwargs):
            user = dict(kwargs)
            for key, value in defaults.items():
                kwargs.setdefault(key, value)
            if map_device is not None:
                args = _mapped(args, kwargs, map_device)
            super().__init__(*args, **kwargs)
            built(self, framework, user)

        def load_state_dict(self, state_dict, *args, **kwargs):
            """A trainer reloading a checkpoint mid-run (ultralytics' NaN recovery reloads ``last.pt``) loads
            the scale state (the run's counters and heal records are not part of it); the reload is an event."""
            before = self._run_scale()
            result = super().load_state_dict(state_dict, *args, **kwargs)
            reloaded(self, before)
            return result

        def unscale_(self, optimizer, *args, **kwargs):
            """The run's samples read the gradients first, while they still carry the scale
            (:meth:`~ampsafe.run.headroom.HeadroomSampler.before_unscale`); the framework's ``step`` and
            ``minimize`` unscale through here too."""
            _before_unscale(self)
            _note_level(self, optimizer)
            return super().unscale_(optimizer, *args, **kwargs)

        def _run_scale(self) -> float | None:
            """The current scale, or None when the scaler cannot say (the report's number)."""
            try:
                return float(scale(self))
            except Exception:  # noqa: BLE001 - an inactive scaler: no scale
                return None

        def _run_guards(self) -> bool:
            return bool(guards(self))

        def _bad_input(self):
            """Also at step 0, before the scaler's own capture saw a forward: the run's guard hooked the model
            when its optimizer was built (:func:`~ampsafe.run.guard.latest_inputs`)."""
            bad = super()._bad_input()
            capture = getattr(self, "capture", None)
            if bad is None and capture is not None and capture.latest is None:
                from ..core.sentinel import nonfinite_input
                from .guard import latest_inputs

                latest = latest_inputs(self.model)
                bad = nonfinite_input(latest, self._backend().tensors) if latest is not None else None
            return bad

    for name in steps:
        setattr(GradScaler, name, _through_scaler(GradScaler, name))
    GradScaler.__doc__ = (
        f"ampsafe.{framework}.GradScaler with ``ampsafe run``'s floor (the script's own arguments win)."
    )
    return shim(GradScaler, replaces)


def _before_unscale(scaler) -> None:
    """Hand the scaler's gradients to its headroom sampler's underflow measurement (a sample is advice: a failure
    stops the sampling, never the step)."""
    from .headroom import sampler_of

    sampler = sampler_of(scaler)
    if sampler is None:
        return
    try:
        sampler.before_unscale(scaler)
    except Exception as exc:  # noqa: BLE001 - training goes on without the sample
        if sampler.underflow is not None:
            sampler.underflow.note = f"underflow sampling stopped: {type(exc).__name__}: {exc}"[:300]


def _note_level(scaler, optimizer) -> None:
    """A scaler the run named static at scale 1 (:mod:`ampsafe.run.static_scale`) learns the AMP level of the
    step's forward while the FP32 guard still holds it; advice only."""
    from .static_scale import watch_of

    watch = watch_of(scaler)
    if watch is None:
        return
    try:
        watch.note_level(optimizer)
    except Exception:  # noqa: BLE001 - the level is a word of the report; training goes on
        pass


def _through_scaler(cls: type, name: str) -> Callable:
    """``cls.<name>(optimizer, ...)`` run inside :func:`~ampsafe.run.guard.through_scaler`: the FP32 guard lets
    the optimizer steps inside it through when the scaler guards them itself."""
    from .guard import through_scaler

    def method(self, optimizer, *args, **kwargs):
        with through_scaler(self._run_guards()):
            return getattr(super(cls, self), name)(optimizer, *args, **kwargs)

    method.__name__, method.__qualname__ = name, f"{cls.__qualname__}.{name}"
    return method


def shim(cls: type, replaces: type | None) -> type:
    """A class the run puts in place of a framework's: it claims :data:`SHIM_MODULE` (what a script sees as its
    type) and answers ``isinstance`` for the class it ``replaces``."""
    cls.__module__ = SHIM_MODULE
    cls._replaces = replaces
    return cls
