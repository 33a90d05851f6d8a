"""One small formatter per engine: the same float32 modules in each engine's own words (:data:`ENGINES`).

Each formatter takes an :class:`~ampsafe.plan.islands.Islands` and returns an :class:`EnginePlan`: the code to
paste, its machine-readable value, and a note saying what the mechanism keeps float32 and what it does not (each
read in the engine's installed code; the tests apply every line to a model).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import ConfigError
from .islands import Islands
from .onnx_names import node_names, scope_pattern

__all__ = ["EnginePlan", "ENGINES", "FRAMEWORK", "module_expr", "megatron_flag"]


@dataclass(frozen=True)
class EnginePlan:
    """One engine's plan. ``code``: what to paste (``language``: ``python``, ``bash``); ``value``: the list,
    patterns or flags as data (empty when nothing matches); ``note``: what it keeps float32 and where it falls
    short; ``modules``: the module paths it names."""

    engine: str
    modules: tuple[str, ...]
    code: str
    language: str = "python"
    value: Any = None
    note: str = ""
    details: dict[str, str] = field(default_factory=dict)

    def to_text(self) -> str:
        return f"# ampsafe plan --to {self.engine}\n# {self.note}\n\n{self.code}\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "modules": list(self.modules),
            "code": self.code,
            "language": self.language,
            "value": self.value,
            "note": self.note,
            "details": dict(self.details),
        }


_INDEX = re.compile(r"^\d+$")


def module_expr(path: str, root: str = "model") -> str:
    """``layers.1.router`` -> ``model.layers[1].router``: the spelling of :func:`ampsafe.torch.fsdp.module_expr`,
    here for Paddle's lines, which must not import torch (a Paddle-only install has none)."""
    out = root
    for part in path.split(".") if path else ():
        out += f"[{part}]" if _INDEX.match(part) else f".{part}"
    return out


def hf(islands: Islands) -> EnginePlan:
    if islands.hf is False:
        raise ConfigError(
            f"the run's model ({islands.model or 'unnamed'}) is not an HF transformers model (the run measures HF's "
            "list only for those): `--to hf` is for models `from_pretrained` loads; use another engine's plan or "
            "the report's island line."
        )
    if islands.hf and not islands.measured:
        raise ConfigError(
            "the run found no module for HF's list: none with weights of its own passed 65504, or the list tried "
            "on the model did not remove the overflow (report.md says which). The report's island line is the fix."
        )
    names = list(islands.keep)
    cls = islands.model or "MyModel"
    code = (
        f"{cls}._keep_in_fp32_modules_strict = {json.dumps(names)}  # on the class, before it loads\n"
        f"model = {cls}.from_pretrained(path, dtype=torch.float16)"
    )
    measured = " (the modules the run measured past 65504 and tried this way)" if islands.measured else ""
    note = (
        f"HF transformers keeps these modules' parameters float32 when `from_pretrained` casts the rest to float16 "
        f"or bfloat16{measured}: `_get_dtype_plan` reads `_keep_in_fp32_modules_strict` for both dtypes "
        "(`_keep_in_fp32_modules` for float16 only) and searches each parameter name for each entry. It works "
        "where the model's code casts a layer's input to the layer's weight dtype (T5's `wo`); under autocast, "
        "which computes these layers in float16 whatever their weights, the island line is the fix."
    )
    return EnginePlan("hf", tuple(names), code, value=names, note=note)


def deepspeed(islands: Islands) -> EnginePlan:
    names = list(islands.modules)
    config = {"torch_autocast": {"enabled": True, "dtype": "float16"}, "data_types": {"keep_in_fp32_modules": names}}
    code = (
        'ds_config.pop("fp16", None)  # "fp16" casts every parameter to float16: no module list exempts one\n'
        f"ds_config.update({config!r})\n"
        "engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), "
        "config=ds_config)\n"
        f'ampsafe.patch(engine.module, policy="island", paths={json.dumps(names)})'
    )
    note = (
        "DeepSpeed 0.19.8's keep list is `data_types.keep_in_fp32_modules` (deepspeed/runtime/constants.py "
        "KEEP_IN_FP32_MODULES, config.py, engine.py `_cast_module_mixed_precision`, runtime/keep_in_fp32.py): name "
        'patterns matched as HF matches them, but it keeps only *buffers* in float32; under "fp16" every parameter '
        "is cast to float16 and no option exempts a module's. The closest real mechanism for parameters is "
        "`torch_autocast` (parameters stay float32, autocast computes in float16, DeepSpeed scales the loss with "
        "torch's GradScaler); autocast still computes these Linear/conv layers in float16, so the island line on "
        "`engine.module` keeps their compute in float32."
    )
    return EnginePlan("deepspeed", tuple(names), code, value=config, note=note)


def _is_norm(path: str) -> bool:
    return "norm" in path.rsplit(".", 1)[-1].lower()


def fsdp2(islands: Islands) -> EnginePlan:
    from ..torch.fsdp import fix_lines

    names = list(islands.keep)
    # a float32 norm output meets float16 layers after it: FSDP2 casts a module's inputs, not its output
    lines = fix_lines(names, back={p: "torch.float16" for p in names if _is_norm(p)})
    code = "\n".join(
        [
            "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard",
            *lines,
            "fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16))  # yours, after them",
        ]
    )
    note = (
        "FSDP2's per-module policy: each line gives the module float32 parameters and casts its floating inputs "
        "to float32; run them before the `fully_shard` calls of the modules that enclose them (the model's own "
        "included), with the same `mesh=` as yours."
    )
    return EnginePlan("fsdp2", tuple(names), code, value=lines, note=note)


_ROUTER = re.compile(r"(^|\.)(router|gate|moe_gate)$", re.IGNORECASE)
_BLOCK = re.compile(r"(^|\.)(layers|layer|h|block|blocks)\.\d+$")


def megatron_flag(path: str) -> str | None:
    """The Megatron-LM flag that keeps ``path`` in float32, or None: ``--moe-router-dtype fp32`` for a MoE router
    (a module named ``router``, ``gate`` or ``moe_gate``), ``--fp32-residual-connection`` for a whole
    transformer block (``layers.N``, ``h.N``, ``block.N``: its output is the residual stream)."""
    if _ROUTER.search(path):
        return "--moe-router-dtype fp32"
    if _BLOCK.search(path):
        return "--fp32-residual-connection"
    return None


def megatron(islands: Islands) -> EnginePlan:
    flags = {p: megatron_flag(p) for p in islands.modules}
    chosen = list(dict.fromkeys(f for f in flags.values() if f))
    unmatched = [p for p, f in flags.items() if f is None]
    code = " ".join(chosen) if chosen else "# no Megatron flag matches these modules"
    note = (
        "Megatron-LM keeps two things float32 by flag: the MoE router (`--moe-router-dtype fp32`) and the residual "
        "stream (`--fp32-residual-connection`)."
    )
    if unmatched:
        note += (
            f" None matches {', '.join(unmatched)}: Megatron has no per-module float32 option for them; keep them "
            "float32 in the model's code (an autocast-disabled region) or use the island line."
        )
    return EnginePlan(
        "megatron", tuple(islands.modules), code, "bash", chosen, note, {p: f or "" for p, f in flags.items()}
    )


def paddle(islands: Islands) -> EnginePlan:
    names = list(islands.keep)
    layers = ", ".join(module_expr(p) for p in names)
    code = (
        "model, optimizer = paddle.amp.decorate(\n"
        f'    models=model, optimizers=optimizer, level="O2", excluded_layers=[{layers}]\n'
        ")\n"
        f'ampsafe.patch(model, policy="island", level="O2", paths={json.dumps(names)})  # their compute in float32'
    )
    note = (
        "Paddle O2's `excluded_layers` keeps these layers' parameters float32 (paddle/amp/auto_cast.py, "
        "`need_keep_fp32`); their matmuls and convs are still on O2's float16 list, so the island line after "
        "`decorate` keeps their compute in float32 too."
    )
    return EnginePlan("paddle", tuple(names), code, value=names, note=note)


def modelopt(islands: Islands, onnx: Any = None) -> EnginePlan:
    names = list(islands.modules)
    if onnx is not None:
        found = node_names(onnx, names)
        patterns = [f"^{re.escape(n)}$" for p in names for n in found[p]]
        details = {p: ", ".join(found[p]) or "no node (its forward exported none)" for p in names}
        where = "the nodes of the given graph under these modules"
    else:
        patterns = [scope_pattern(p) for p in names]
        details = {p: scope_pattern(p) for p in names}
        where = "patterns of the node names `torch.onnx.export(model, args, 'model.onnx', dynamo=False)` gives these modules"
    code = (
        "from modelopt.onnx.autocast import convert_to_mixed_precision\n"
        "model_fp16 = convert_to_mixed_precision(\n"
        f'    onnx_path="model.onnx", low_precision_type="fp16", nodes_to_exclude={json.dumps(patterns)}\n'
        ")"
    )
    note = (
        f"ModelOpt AutoCast keeps the nodes `nodes_to_exclude` matches (re.match) in float32 ({where}); TensorRT's "
        "replacement for its removed FP16 builder flag."
    )
    return EnginePlan("modelopt", tuple(names), code, value=patterns, note=note, details=details)


# the framework each engine's lines are written for
FRAMEWORK = {
    "hf": "torch",
    "deepspeed": "torch",
    "fsdp2": "torch",
    "megatron": "torch",
    "paddle": "paddle",
    "modelopt": "torch",
}

ENGINES: dict[str, Callable[..., EnginePlan]] = {
    "hf": hf,
    "deepspeed": deepspeed,
    "fsdp2": fsdp2,
    "megatron": megatron,
    "paddle": paddle,
    "modelopt": modelopt,
}
