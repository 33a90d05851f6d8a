"""FSDP2 (``fully_shard``) in pure float16: what a heal needs to see float32, and the island's permanent fix line.

Why a module of its own: under ``fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16))``
(torchtitan, verl, lerobot) no autocast is on; FSDP2 all-gathers every parameter in float16, so every layer
computes in float16. Turning autocast off (``backend.amp.float32()``) leaves that in place, and a heal's "float32"
scan or replay of the batch overflowed exactly as the step did and read as a numerical error.
:func:`float32_params` switches every FSDP2 parameter group of a model to float32 all-gathers for the duration
(FSDP2's own mixed-precision attributes, the parameters' sharding untouched) and back afterwards. It is
collective like any FSDP2 forward: every rank runs the same forwards inside it.

An island under FSDP2 is ``FP32Island`` on the module (float32 inputs, float32 copies of its float16 weights);
the permanent fix is FSDP2's own per-module policy, applied before the enclosing ``fully_shard`` call::

    fully_shard(model.decoder.block[1].layer[2].DenseReluDense.wo,
                mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32))

(:func:`fully_shard_lines`, the one formatter of these lines), which gives the module float32 parameters and casts
its floating inputs to float32.

A value past 65504 that one ``fully_shard`` unit hands to another (per-layer sharding, torchtitan's and verl's
layout) is cast to float16 by the receiving unit's pre-forward hook, past any island. FSDP2 reads a unit's policy
at every forward (``FSDPState._mp_policy`` for the input and output casts, ``FSDPParam.param_dtype`` for the
all-gather), so :func:`widen_units` gives those units a float32 ``param_dtype`` for the rest of the run, as
:func:`float32_params` does for the length of a replay; the permanent fix is the same policy in the user's own
``fully_shard`` call of each unit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import torch

from ..core.backend import Sharding

__all__ = [
    "Fsdp2",
    "fsdp_modules",
    "float16_sharded",
    "float32_params",
    "fix_lines",
    "fully_shard_lines",
    "units_of",
    "widen_units",
    "module_expr",
    "engine_fix",
    "low_input_modules",
    "zero3_partitioned",
    "ADVICE",
    "UNIT_ADVICE",
]


def _fsdp_module_type():
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        return None
    return FSDPModule


def fsdp_modules(model) -> list:
    """The FSDP2 modules (``fully_shard``-ed) in ``model``, outermost first."""
    kind = _fsdp_module_type()
    if kind is None or not isinstance(model, torch.nn.Module):
        return []
    return [m for m in model.modules() if isinstance(m, kind)]


def _low(dtype) -> bool:
    return dtype in (torch.float16, torch.bfloat16)


def _groups(state) -> list:
    """The FSDP parameter groups of one ``fully_shard`` state (none for a unit that holds no parameters)."""
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:  # a torch with one group per state
        group = getattr(state, "_fsdp_param_group", None)
        groups = [group] if group is not None else []
    return list(groups)


def float16_sharded(model) -> bool:
    """Whether an FSDP2 policy of ``model`` computes some parameters in float16/bfloat16 (``param_dtype``)."""
    return any(_low(m._get_fsdp_state()._mp_policy.param_dtype) for m in fsdp_modules(model))


def low_input_modules(model) -> list[str]:
    """The ``fully_shard`` submodules of ``model`` (the root left out) whose forward inputs FSDP2 casts to a low
    ``param_dtype`` (``cast_forward_inputs``, its default): in a decoder sharded per layer, the residual stream
    enters each layer in float16, so an island inside the previous layer cannot keep it float32."""
    shards, out = set(fsdp_modules(model)), []
    for name, module in model.named_modules() if shards else ():
        if name and module in shards:
            policy = module._get_fsdp_state()._mp_policy
            if _low(policy.param_dtype) and policy.cast_forward_inputs:
                out.append(name)
    return out


_PARAM_SLOTS = ("param_dtype", "reduce_dtype", "all_gather_outputs", "_unsharded_param")


def _save_param(fsdp_param) -> dict:
    return {k: getattr(fsdp_param, k) for k in _PARAM_SLOTS if hasattr(fsdp_param, k)}


def _load_param(fsdp_param, saved: dict) -> None:
    for key in _PARAM_SLOTS:
        if key in saved:
            setattr(fsdp_param, key, saved[key])
        elif hasattr(fsdp_param, key):
            delattr(fsdp_param, key)


@contextlib.contextmanager
def float32_params(model) -> Iterator[None]:
    """Every FSDP2 group of ``model`` all-gathers float32 parameters (and casts forward inputs to float32) inside
    the block; FSDP2's own state (policies, per-parameter dtypes, its cached float16 buffers) is put back after.

    Nothing happens for a model without a float16 FSDP2 policy. A group still unsharded (after a forward under
    no grad, or the root's forward) is resharded first, so its float16 buffers are free when they are set aside.
    """
    if not float16_sharded(model):
        yield
        return
    saved: list[tuple[str, Any, Any]] = []  # (kind, owner, what to put back)
    try:
        for module in fsdp_modules(model):
            state = module._get_fsdp_state()
            wide = dataclasses.replace(state._mp_policy, param_dtype=torch.float32)
            saved.append(("state", state, state._mp_policy))
            state._mp_policy = wide
            for group in _groups(state):
                if not group.is_sharded:
                    group.reshard()
                saved.append(("group", group, group.mp_policy))
                group.mp_policy = dataclasses.replace(group.mp_policy, param_dtype=torch.float32)
                for fsdp_param in group.fsdp_params:
                    saved.append(("param", fsdp_param, _save_param(fsdp_param)))
                    _regather(fsdp_param, group.mp_policy)
        yield
    finally:
        for kind, owner, old in reversed(saved):
            if kind == "state":
                owner._mp_policy = old
            elif kind == "group":
                if not owner.is_sharded:
                    owner.reshard()
                owner.mp_policy = old
            else:
                _load_param(owner, old)


def _regather(fsdp_param, policy) -> None:
    """``fsdp_param`` all-gathers in ``policy``'s ``param_dtype`` from its next unshard on: FSDP2 keeps the buffers
    of its first all-gather (``FSDPParam.init_all_gather_outputs`` and ``init_unsharded_param`` return early once
    they exist), so they are dropped with the dtype attributes set again (``init_dtype_attrs``)."""
    fsdp_param.init_dtype_attrs(policy)
    fsdp_param.all_gather_outputs = []
    if hasattr(fsdp_param, "_unsharded_param"):
        del fsdp_param._unsharded_param


def units_of(model, layers) -> list[str]:
    """The ``fully_shard`` units (module paths, the root left out) that own the modules at ``layers``: for each,
    the innermost ``fully_shard`` module that is it or encloses it; in model order, each once."""
    shards = set(fsdp_modules(model))
    units = [name for name, module in model.named_modules() if name and module in shards]
    owned = set()
    for layer in layers:
        inner = [u for u in units if layer == u or layer.startswith(u + ".")]
        if inner:
            owned.add(max(inner, key=len))
    return [u for u in units if u in owned]


def _widened(policy):
    """``policy`` with float32 compute, and no cast of the unit's output back to a low dtype (the value it hands on
    is what passes 65504)."""
    out = policy.output_dtype if policy.output_dtype is None or not _low(policy.output_dtype) else None
    return dataclasses.replace(policy, param_dtype=torch.float32, output_dtype=out)


def widen_units(model, units) -> list[str]:
    """Give the ``fully_shard`` units at ``units`` (module paths) a float32 ``param_dtype`` for the rest of the
    run: their inputs are cast to float32, their parameters all-gathered in float32 (the sharded float32 parameters
    and the optimizer are untouched), their gradients reduced in float32. Returns the units changed (those with a
    low ``param_dtype``). Every rank must widen the same units: the all-gathers of a unit then carry float32 on all
    of them. A unit still unsharded (after a forward under no grad) is resharded first."""
    modules = dict(model.named_modules())
    shards = set(fsdp_modules(model))
    changed = []
    for path in units:
        module = modules.get(path)
        if module is None or module not in shards:
            continue
        state = module._get_fsdp_state()
        if not _low(state._mp_policy.param_dtype):
            continue
        state._mp_policy = wide = _widened(state._mp_policy)
        for group in _groups(state):
            if not group.is_sharded:
                group.reshard()
            group.mp_policy = wide
            for fsdp_param in group.fsdp_params:
                _regather(fsdp_param, group.mp_policy)
            group._init_mp_dtypes()  # the group's reduce dtype follows its parameters'
        changed.append(path)
    return changed


_INDEX = re.compile(r"^\d+$")


def module_expr(path: str, root: str = "model") -> str:
    """``decoder.block.1.layer.2.wo`` -> ``model.decoder.block[1].layer[2].wo``: the module as Python code."""
    out = root
    for part in path.split(".") if path else ():
        out += f"[{part}]" if _INDEX.match(part) else f".{part}"
    return out


def fully_shard_lines(paths, root: str = "model", back: dict | None = None) -> list[str]:
    """The FSDP2 lines that keep ``paths`` in float32 for good: one ``fully_shard`` each, to run before the
    ``fully_shard`` calls of the modules that enclose them (the model's own included), or in place of the script's
    own call of a module it already shards. ``back``: path -> the dtype (``"torch.float16"``) its output goes back
    to (``output_dtype``), for the float16 layers after it. The one formatter of these lines (the report's, and
    any plan's)."""
    back = back or {}
    lines = []
    for p in paths:
        out = f", output_dtype={back[p]}" if p in back else ""
        lines.append(
            f"fully_shard({module_expr(p, root)}, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32{out}))"
        )
    return lines


fix_lines = fully_shard_lines  # the earlier name


def _normalizes(module) -> bool:
    """A normalization (LayerNorm, RMSNorm, HF's LlamaRMSNorm, BatchNorm, GroupNorm): its output is bounded, so
    float16 holds it."""
    return "Norm" in type(module).__name__


ADVICE = (
    "FSDP2 with a float16 `param_dtype` computes every layer in float16, and the patch line above reads the "
    "islands' float16 weights as float32 copies. FSDP2's own way keeps these modules' parameters and compute in "
    "float32: run these lines before the `fully_shard` calls of the modules that enclose them (the model's own "
    "included), with the same `mesh=` as yours:"
)
UNIT_ADVICE = (
    "FSDP2 casts the inputs of each `fully_shard` unit to its float16 `param_dtype`, so a value past 65504 that "
    "one unit hands to the next is stored in float16 there, past any FP32 island; the heal gave these units a "
    "float32 policy for the run. Make it permanent with FSDP2's own policy: each line replaces your script's "
    "`fully_shard` call of that module (same `mesh=` and other arguments as yours; run the ones of modules you did "
    "not shard before the calls of the modules that enclose them):"
)


def engine_fix(model, paths) -> dict[str, tuple[str, str]]:
    """The report's FSDP2 fix of the healed ``paths``: ``{"torch_fsdp2": (lines, advice)}``, one ``fully_shard``
    line per module that holds parameters (an activation has nothing to cast); {} unless ``model`` has a float16
    FSDP2 policy."""
    if not float16_sharded(model):
        return {}
    modules = dict(model.named_modules())
    kept = [p for p in paths if p in modules and any(True for _ in modules[p].parameters())]
    # a float32 norm output meets float16 layers after it ("expected m1 and m2 to have the same dtype"); FSDP2 casts
    # a module's inputs, not its output, so a normalization's goes back to the model's dtype, which holds it
    low = str(fsdp_modules(model)[0]._get_fsdp_state()._mp_policy.param_dtype)
    lines = fully_shard_lines(kept, back={p: low for p in kept if _normalizes(modules[p])})
    shards = set(fsdp_modules(model))
    advice = UNIT_ADVICE if any(modules[p] in shards for p in kept) else ADVICE
    return {"torch_fsdp2": ("\n".join(lines), advice)} if lines else {}


def zero3_partitioned(model) -> bool:
    """Whether DeepSpeed ZeRO-3 partitions ``model``'s parameters (its ``ds_status`` on them): each forward then
    all-gathers them module by module, a collective every rank must join, as under FSDP2."""
    return isinstance(model, torch.nn.Module) and any(hasattr(p, "ds_status") for p in model.parameters())


class Fsdp2(Sharding):
    """FSDP2 as :class:`~ampsafe.core.backend.Sharding` (``TorchBackend.sharding``); a model without
    ``fully_shard`` modules gets the base's answers, except that a ZeRO-3 model's forward is collective too."""

    def float32_params(self, model):
        return float32_params(model)

    def forward_is_collective(self, model) -> bool:
        return bool(fsdp_modules(model)) or zero3_partitioned(model)

    def fix(self, model, paths: list[str]) -> dict[str, tuple[str, str]]:
        return engine_fix(model, paths)

    def low_inputs(self, model) -> list[str]:
        return low_input_modules(model)

    def widen(self, model, layers: list[str]) -> list[str]:
        return widen_units(model, [u for u in units_of(model, layers) if u in low_input_modules(model)])
