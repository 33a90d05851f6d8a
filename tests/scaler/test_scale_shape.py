"""The scale package stays small and its base class stays a template with few hooks: every file under 450 lines,
``ScalerBase`` overridden in at most 3 methods (dunders, Python's own protocol, aside), and the heal's streak
counted in one place (its trigger)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import ampsafe
import ampsafe.core.scale as scale
import ampsafe.paddle.scaler
import ampsafe.torch.deepspeed
import ampsafe.torch.scaler  # noqa: F401 - every adapter is loaded, so every override is seen
from ampsafe.core.scale import ScalerBase
from ampsafe.healing.trigger import HealTrigger

STREAK = re.compile(r"\b(in_row|_?streak)\s*\+=")  # a count of overflowing steps in a row


def _subclasses(cls: type):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_file_of_the_scale_package_is_under_450_lines():
    files = sorted(Path(scale.__file__).parent.glob("*.py"))
    lengths = {f.name: len(f.read_text(encoding="utf-8").splitlines()) for f in files}
    assert len(files) >= 4 and all(n <= 450 for n in lengths.values()), lengths


def test_scaler_base_has_at_most_three_hooks():
    own = {
        name
        for name, value in vars(ScalerBase).items()
        if not name.startswith("__") and (inspect.isfunction(value) or isinstance(value, property))
    }
    hooks = {name for sub in _subclasses(ScalerBase) for name in vars(sub) if name in own}
    assert hooks == {"_backend", "_refresh_scale", "_evidence"}, hooks


def test_the_streak_is_counted_once_in_the_heal_trigger():
    package = Path(ampsafe.__file__).parent
    counting = [
        f"{path.relative_to(package)}:{i}"
        for path in sorted(package.rglob("*.py"))
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if STREAK.search(line)
    ]
    assert counting == ["healing/trigger.py:" + str(_line_of(HealTrigger.observe, "in_row += 1"))], counting


def _line_of(function, text: str) -> int:
    lines, start = inspect.getsourcelines(function)
    return start + next(i for i, line in enumerate(lines) if text in line)
