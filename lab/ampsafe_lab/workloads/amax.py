"""Recording the float32 abs-max of each module's output during a forward pass (the brink recipes' probe).

Why one class: the torch and Paddle brinks record the same thing; a subclass only says which modules to hook,
how its framework registers a forward hook, and how to read a value from an output.
"""

from __future__ import annotations

import time

from ampsafe.core.graph import FP16_MAX

__all__ = ["AmaxRecorder", "FP16_MAX", "over_fp16", "record_head"]


def over_fp16(amax_by_layer: dict) -> dict:
    """The modules whose output abs-max is past float16's range, largest first."""
    return {k: v for k, v in sorted(amax_by_layer.items(), key=lambda kv: -kv[1]) if v > FP16_MAX}


def record_head(seed: int, recipe: dict, crossed: dict, history: list, started: float, **versions) -> dict:
    """What every brink record starts with: the seed and recipe, the framework ``versions`` it was trained with,
    the first step a module's output passed float16's range, the steps trained and how long they took (since the
    ``time.perf_counter()`` value ``started``)."""
    return {
        "seed": seed,
        "recipe": recipe,
        **versions,
        "crossed_step": crossed["step"],
        "steps_trained": len(history),
        "train_seconds": round(time.perf_counter() - started, 2),
    }


class AmaxRecorder:
    """Context manager: forward hooks record the largest abs value of each module's output since ``reset()``.

    ``amax`` maps module path to that value, in the order the modules first ran.
    """

    def __init__(self, model):
        self.model = model
        self.amax: dict[str, float] = {}
        self._handles = []

    def reset(self) -> None:
        self.amax = {}

    def _modules(self):  # pragma: no cover - subclasses
        """(path, module) pairs to hook."""
        raise NotImplementedError

    def _register(self, module, hook):  # pragma: no cover - subclasses
        """Register ``hook(module, inputs, output)`` to run after ``module``'s forward; returns a removable handle."""
        raise NotImplementedError

    def _value(self, output):  # pragma: no cover - subclasses
        """The output's float abs-max, or None when it holds no floating tensor."""
        raise NotImplementedError

    def _hook(self, name):
        def record(module, inputs, output):
            value = self._value(output)
            if value is not None and value > self.amax.get(name, -1.0):
                self.amax[name] = value

        return record

    def __enter__(self):
        for name, module in self._modules():
            self._handles.append(self._register(module, self._hook(name)))
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()
        self._handles = []
