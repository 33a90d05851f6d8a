"""``ampsafe plan``: the modules a run healed (or a scan found risky) as each engine's own float32 keep list.

What stays float32 is chosen by hand in every engine (HF's ``_keep_in_fp32_modules_strict``, DeepSpeed's
config, FSDP2's per-module ``MixedPrecisionPolicy``, Megatron's flags, Paddle's ``excluded_layers``, ModelOpt
AutoCast's ``nodes_to_exclude``); a run's report already knows which modules overflowed. Example::

    from ampsafe.plan import plan
    print(plan("ampsafe-run/report.json", "fsdp2").code)
    print(plan(ampsafe.scan(model, inputs), "modelopt", onnx="model.onnx").code)

``ampsafe plan REPORT.json --to ENGINE`` prints the same.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .engines import ENGINES, FRAMEWORK, EnginePlan, megatron_flag, module_expr
from .islands import Islands, from_report, from_scan, load
from .onnx_names import node_names, scope_pattern

__all__ = [
    "plan",
    "ENGINES",
    "EnginePlan",
    "Islands",
    "from_report",
    "from_scan",
    "load",
    "megatron_flag",
    "module_expr",
    "node_names",
    "scope_pattern",
]


def plan(source: Any, engine: str, *, onnx: Any = None) -> EnginePlan:
    """The float32 modules of ``source`` (a ``report.json`` path or dict, an ``ampsafe.scan`` result, or
    :class:`Islands`) in ``engine``'s words (one of :data:`ENGINES`). ``onnx`` (``modelopt`` only): the exported
    graph, whose exact node names the plan then lists. Raises ``ConfigError`` on bad input, having changed nothing."""
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}: choose one of {', '.join(ENGINES)}")
    if onnx is not None and engine != "modelopt":
        raise ConfigError("an ONNX graph is read only for `--to modelopt`: leave it out for other engines")
    islands = load(source)
    if islands.framework and islands.framework != FRAMEWORK[engine]:
        raise ConfigError(
            f"`{engine}` plans are for {FRAMEWORK[engine]} models and this run trained a {islands.framework} model: "
            f"choose one of {', '.join(e for e, f in FRAMEWORK.items() if f == islands.framework)}"
        )
    return ENGINES[engine](islands, onnx=onnx) if engine == "modelopt" else ENGINES[engine](islands)
