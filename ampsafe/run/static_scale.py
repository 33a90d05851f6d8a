"""A scaler built with a fixed loss scale of 1: named when it is built, measured on its steps, and the fix
chosen from the measurement (:class:`StaticScaleWatch`, kept as :class:`~ampsafe.run.records.StaticScale`).

Why: PaddleOCR's ``tools/train.py`` reads ``Global.scale_loss`` (default 1.0) and
``Global.use_dynamic_loss_scaling`` (default False) into ``paddle.amp.GradScaler``, and ``Global.amp_level``
defaults to O2. A config that sets only ``use_amp: True`` (its own ``*_ampO2_ultra.yml`` rec configs do) trains
pure float16 with a scale fixed at 1: a step with an inf is still skipped, but the scale never moves, so every
gradient element below float16's smallest subnormal flushes to zero without a word. The trap is read from the
scaler the script built (its policy: not dynamic, scale 1), never from a YAML file, so any script that builds such
a scaler is named; a running trainer host words the fix in its own keys (:attr:`ampsafe.hosts.Host.static_scale`).

What the run does about it: it names it and measures it, and changes nothing (never worse than native: the
scaler keeps the script's arguments, so the run trains as the script asked). The fix is the user's to apply.
"""

from __future__ import annotations

import re
import weakref
from typing import Any, Callable, Optional

from ..core.underflow import LOST_LIMIT, Underflow, lift_scale
from .records import StaticScale

__all__ = ["StaticScaleWatch", "static_scale_of", "watch_of", "TRAP_SCALE"]

TRAP_SCALE = 1.0  # a fixed scale at or below this is no loss scaling at all
# scaler -> its watch; weak, and off the scaler, so that pickling a scaler never drags the run along
_WATCHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def watch_of(scaler) -> Optional[StaticScaleWatch]:
    """The :class:`StaticScaleWatch` of a scaler the run named static, or None."""
    try:
        return _WATCHES.get(scaler)
    except TypeError:  # a scaler that takes no weak reference is never watched
        return None


def static_scale_of(scaler) -> Optional[float]:
    """The scaler's fixed scale when it scales without dynamic scaling at a scale of at most 1, else None (a
    dynamic scaler, a disabled one, ampsafe's FP32 guard mode, a deliberate fixed scale above 1)."""
    policy = getattr(scaler, "policy", None)
    if policy is None or policy.dynamic or getattr(scaler, "_guard", False):
        return None
    if getattr(scaler, "disabled_reason", None) is not None:
        return None
    scale = scaler._run_scale() if hasattr(scaler, "_run_scale") else None
    return scale if scale is not None and 0 < scale <= TRAP_SCALE else None


def _level(scaler) -> str:
    """The AMP level of the scaler's latest captured forward (``"O1"`` / ``"O2"``), or "" when not known: a
    float16 emulator's own level, else the framework's (the capture's state: emulator, level, dtype)."""
    capture = getattr(scaler, "capture", None)
    state = getattr(capture, "state", None)
    if not isinstance(state, tuple) or len(state) != 3:
        return ""
    emulator, level, _ = state
    level = str(getattr(emulator, "level", None) or level or "")
    return level if level in ("O1", "O2") else ""


def _call(kwargs: dict) -> str:
    """The scaler's arguments as the script passed them (``init_loss_scaling=1.0, ...``)."""
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def _trainer_fix(scale: float) -> dict:
    """The running trainer's words for a dynamic scale from ``scale`` (``{}`` when no host has them)."""
    from ..hosts import running

    for host in running():
        if host.static_scale is not None:
            return host.static_scale(scale)
    return {}


_CODE = {"paddle": "scaler = paddle.amp.GradScaler(init_loss_scaling={scale:g}, use_dynamic_loss_scaling=True)"}


class StaticScaleWatch:
    """One scaler built static at scale 1: the banner line at build; the measurement of the first sampled step
    whose gradients were finite (the run's underflow series, :mod:`ampsafe.run.underflow`) and the fix chosen from
    it, one line then. One step, so that the line printed and the report say the same; the report's
    ``## Gradient underflow`` has the later samples."""

    def __init__(self, scaler, framework: str, kwargs: dict, scale: float, say: Callable[[str], None]) -> None:
        self.framework = framework
        self.kwargs = {k: repr(v) for k, v in kwargs.items()}
        self.scale = float(scale)
        self.level = ""
        self.say = say
        self.measured: Optional[Underflow] = None
        self.chosen: Optional[float] = None
        self.sampled = False  # the run's underflow series was there at a step
        try:
            _WATCHES[scaler] = self
        except TypeError:  # no weak reference: the level comes from the scaler's own capture only
            pass
        source = _trainer_fix(self.scale).get("source", "")
        built = f"{framework}'s GradScaler({_call(kwargs)})" if kwargs else f"{framework}'s GradScaler"
        if source:
            built += f", from {source}"
        say(
            f"{built}: a static loss scale of {self.scale:g}, no dynamic scaling: a step with an inf is still "
            "skipped, but the scale never moves and gradients below 6e-8 flush to zero in float16 without a word; "
            "kept as built (training unchanged), measured, and the fix printed at the first step with finite gradients"
        )

    def note_level(self, optimizer) -> None:
        """Before the scaler unscales ``optimizer``'s gradients: the level of the step's forward, as the FP32
        guard saw it (at step 0 the scaler has captured no forward yet). Called by the run's scaler class."""
        if self.level:
            return
        from .guard import forward_precision

        found = re.search(r"\bO[12]\b", forward_precision(optimizer) or "")
        self.level = found.group(0) if found else ""

    @property
    def words(self) -> str:
        """``O2, static loss scale 1, no dynamic scaling`` (the level left out while not known)."""
        return ", ".join(w for w in (self.level, f"static loss scale {self.scale:g}", "no dynamic scaling") if w)

    def on_step(self, scaler, decision, series: Any) -> None:
        """Step ``decision``: the level at the first step; the series' sample of this step, the first time a
        sampled step's gradients were finite (a skipped step's inf says nothing of underflow)."""
        if not self.level:
            self.level = _level(scaler)
        self.sampled = self.sampled or series is not None
        latest = getattr(series, "latest", None)
        if self.measured is not None or decision.found_inf or latest is None or latest.step != decision.step:
            return
        if latest.elements:
            self.measured, self.chosen = latest, lift_scale(latest, LOST_LIMIT)
            self.say(self._measured_line())

    def _fix(self) -> tuple[dict, str]:
        scale = self.chosen if self.chosen is not None else self.scale
        code = _CODE.get(self.framework, "")
        return _trainer_fix(scale), code.format(scale=scale) if code else ""

    def _measured_line(self) -> str:
        u, (trainer, code) = self.measured, self._fix()
        fix = trainer.get("overrides") or code
        where = trainer.get("overrides_note")
        yaml = ", ".join(f"{k}: {v}" for k, v in trainer.get("config", {}).items())
        return (
            f"step {u.step}: {self.words}: {u.zero:.2%} of {u.elements:,} gradient elements are zero in float16 and "
            f"{u.subnormal:.2%} subnormal (below 2^-14); fix: {fix}"
            + (f" ({where})" if where else "")
            + (f", or in the config: {yaml}" if yaml else "")
            + f"; at scale {self.chosen:g} {u.subnormal_at(self.chosen):.2%} of the non-zero elements would stay "
            "subnormal (see report.md)"
        )

    def _note(self) -> str:
        if self.measured is not None:
            return ""
        if not self.sampled:
            return "the run sampled no gradient underflow (--no-underflow or --headroom-every 0)"
        return "no sampled step had finite gradients"

    def record(self) -> StaticScale:
        u = self.measured
        trainer, code = self._fix()
        return StaticScale(
            level=self.level,
            scale=self.scale,
            dynamic=False,
            words=self.words,
            kwargs=dict(self.kwargs),
            step=u.step if u is not None else None,
            zero=u.zero if u is not None else None,
            subnormal=u.subnormal if u is not None else None,
            elements=u.elements if u is not None else 0,
            chosen_scale=self.chosen,
            subnormal_at_chosen=u.subnormal_at(self.chosen) if u is not None and self.chosen else None,
            trainer=trainer.get("trainer", ""),
            config=dict(trainer.get("config", {})),
            overrides=trainer.get("overrides", ""),
            overrides_note=trainer.get("overrides_note", ""),
            code=code,
            note=self._note(),
        )
