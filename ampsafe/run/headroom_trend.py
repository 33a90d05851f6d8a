"""The run's early-warning rule over the headroom monitor (:mod:`ampsafe.core.headroom`): :class:`TrendRule`.

Why a module of its own: the rule is pure arithmetic on ``(step, amax)`` samples, apart from the hooks that take
them, so it is read, tuned and tested alone. :func:`trend` fits log2 amax against steps over the last
:data:`WINDOW` samples of a module; :func:`judge` warns once, when a projected crossing of 65504 is within
:data:`HORIZON` steps with fewer than :data:`WARN_BITS` left, naming the nearest module and the next ones
within the horizon.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

from .records import HeadroomAlert

__all__ = [
    "TrendRule",
    "bits",
    "trend",
    "judge",
    "LOG2_MAX",
    "WINDOW",
    "MIN_SAMPLES",
    "HORIZON",
    "WARN_BITS",
    "MIN_RISE_BITS",
]

FP16_MAX = 65504.0
LOG2_MAX = math.log2(FP16_MAX)
WINDOW = 6  # samples per module in the trend fit
MIN_SAMPLES = 3  # samples before a trend is trusted
HORIZON = 10  # steps: a projected crossing this close warns (healthy resnet18: fc's early fall projects 11-22)
# and only below this headroom: 64x of room outlasts an early trend (healthy resnet18 on AVX2 kernels: 7.5 bits
# left, rising a bit a step, at step 11)
WARN_BITS = 6.0
MIN_RISE_BITS = 0.5  # the window's fitted rise: noise on a flat series never warns


def bits(amax: Optional[float]) -> Optional[float]:
    """float16 headroom of a magnitude, log2(65504 / amax): None for a non-finite sample, inf for 0."""
    if amax is None or not math.isfinite(amax):
        return None
    return math.inf if amax == 0 else LOG2_MAX - math.log2(amax)


def trend(points: list[tuple[int, float]]) -> Optional[tuple[float, float, float]]:
    """``(bits lost per step, headroom now, projected crossing step)`` of one module's ``(step, amax)`` samples
    (the last :data:`WINDOW` finite ones), or None when they do not rise: fewer than :data:`MIN_SAMPLES`, a slope
    of 0 or less, a fitted rise under :data:`MIN_RISE_BITS` (or under half the headroom left, when that is less),
    or a last sample below the window's mean."""
    recent = points[-4 * WINDOW :]  # a long run's series is never walked whole
    finite = [(s, math.log2(a)) for s, a in recent if a is not None and math.isfinite(a) and a > 0][-WINDOW:]
    if len(finite) < MIN_SAMPLES:
        return None
    n = len(finite)
    ms = sum(s for s, _ in finite) / n
    my = sum(y for _, y in finite) / n
    var = sum((s - ms) ** 2 for s, _ in finite)
    if var == 0:
        return None
    slope = sum((s - ms) * (y - my) for s, y in finite) / var
    last_step, last = finite[-1]
    headroom = LOG2_MAX - last
    # the fitted rise must pass noise's: MIN_RISE_BITS, or half of what is left when less than a bit is left
    if slope <= 0 or slope * (last_step - finite[0][0]) < min(MIN_RISE_BITS, headroom / 2) or last < my:
        return None
    return slope, headroom, last_step + max(headroom, 0.0) / slope


def judge(series: dict, step: int, every: int) -> tuple[bool, Optional[HeadroomAlert]]:
    """``(near, alert)`` at ``step`` for ``series`` (module -> its ``(step, amax)`` samples): ``near`` when a
    projected crossing is within twice the horizon (or the sampling interval ``every``: sample every step until
    the trend settles); ``alert`` for the nearest module projected to cross within :data:`HORIZON` steps with
    fewer than :data:`WARN_BITS` left, or None."""
    close = []  # projected to cross within the horizon; the warning needs one of them under WARN_BITS
    near = False
    for name, points in series.items():
        found = trend(points)
        if found is None:
            continue
        near = near or found[2] - step <= 2 * max(HORIZON, every)
        if found[2] - step <= HORIZON:
            close.append((found[2], name, found))
    close.sort()
    due = [c for c in close if c[2][1] < WARN_BITS]
    if not due:
        return near, None
    _, name, (slope, headroom, crossing) = due[0]
    also = tuple(n for _, n, _ in close if n != name)[:3]
    crossing_step = max(step + 1, math.ceil(crossing))
    message = (
        f"`{name}` loses {slope * 100:.3g} bits of float16 headroom per 100 steps ({headroom:.2f} bits left at "
        f"step {step}); at this rate it passes 65504 near step {crossing_step:,}"
        + (f" (also near: {', '.join(f'`{n}`' for n in also)})" if also else "")
        + ". An FP32 island for its path keeps it in range; `ampsafe scan` on a batch names the path"
    )
    alert = HeadroomAlert(
        module=name,
        step=step,
        headroom_bits=round(headroom, 4),
        bits_per_100=round(slope * 100, 4),
        crossing_step=crossing_step,
        also=also,
        message=message,
    )
    return near, alert


class TrendRule:
    """The run's rule (``rule(monitor, step, amax)``): :func:`judge` on the monitor's series after each sample;
    ``near`` asks the sampler for every step, and the first alert goes to ``say``, once."""

    def __init__(self, every: int, say: Callable[[str], None]) -> None:
        self.every, self.say = every, say
        self.near = False
        self.alert: Optional[HeadroomAlert] = None

    def __call__(self, monitor, step: int, amax: dict) -> None:
        self.near, alert = judge(monitor.series, step, self.every)
        if alert is not None and self.alert is None:
            self.alert = alert
            self.say(alert.message)
