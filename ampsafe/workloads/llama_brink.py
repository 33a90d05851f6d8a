"""The ``llama`` "brink" checkpoint: HF Llama trained in float32 until ``down_proj`` leaves float16's range.

How the recipe was found: the 2-layer ``LlamaForCausalLM`` of :mod:`.llama` (hidden 64, MLP 256, random init)
trained in float32 with Adam on uniform random tokens (batch 8 x 32; the loss stays near ``ln 128``) grows
``model.layers.0.mlp.down_proj`` from the first steps on, and with it the residual stream that every later layer
adds to and that only the RMSNorms read normalized. At lr 0.1 the growth slows (seed 0: the stream after the last
layer reaches ~63e3 at step 59, ``down_proj`` ~36e3); at lr 0.2 it does not: the stream after the last decoder layer
(``model.layers.1``, the stream before ``model.norm``) passes 65504 first, at step 11 (~73e3, ``down_proj`` ~59e3),
and ``layers.0.mlp.down_proj`` passes it one step later (~78e3, the stream ~93e3); ``o_proj`` stays below 1e3
(seed 0, measured on a 2-core Xeon, torch 2.14, transformers 5.24). A module never passes 65504 before the stream
does here: the stream is the modules' sum plus the embedding. Under float16 AMP the stream is float32 and only
``down_proj``'s float16 output overflows; in pure float16 (FSDP2's ``param_dtype=torch.float16``) the stream is
float16 too, so an FP32 island of ``down_proj`` cannot hold it: the next layer reads the stream in float16 again.
Nothing is injected.

Training stops once ``down_proj``'s output on ``example_inputs`` is past ``PROBE_FACTOR`` x 65504, at least
``extra_steps`` steps after the first crossing; model and Adam state (and the same after ``warm_steps``, still in
range), and a record of where and when it crossed, are cached under ``$AMPSAFE_CACHE`` (a few seconds, a file lock).

    w, opt, first = brink_start(seed=0)   # build("llama", seed=seed) with the brink's model and Adam state loaded
    rec = brink_record(seed=0)            # {"crossed_step", "first_layer", "over_fp16_at_crossing", "probe", ...}
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Union

from .amax import FP16_MAX, AmaxRecorder, over_fp16, record_head
from .cache import cache_dir as _cache_dir
from .cache import load_or_build_torch, recipe_key

__all__ = [
    "FP16_MAX",
    "PROBE_FACTOR",
    "RECIPE",
    "STREAM",
    "DOWN",
    "stream_amax",
    "brink_state",
    "brink_record",
    "brink_start",
    "cache_path",
]

PROBE_FACTOR = 1.1
RECIPE = {
    "seq_len": 32,
    "batch_size": 8,
    "optimizer": "adam",
    "lr": 0.2,
    "max_steps": 40,
    "extra_steps": 1,
    "warm_steps": 6,
    "version": 1,
}
STREAM = "model.layers.1"  # the last decoder layer's output: the residual stream before model.norm
DOWN = "model.layers.0.mlp.down_proj"  # the module that grows the stream


class stream_amax(AmaxRecorder):
    """Forward hooks record the float32 abs-max of every leaf module's output and of every decoder layer's (the
    residual stream after it, a non-leaf module, so a module's and the stream's magnitudes read side by side)."""

    def _modules(self):
        layers = {f"model.layers.{i}" for i in range(len(self.model.model.layers))}
        return (
            (name, m)
            for name, m in self.model.named_modules()
            if name in layers or (name and not any(True for _ in m.children()))
        )

    def _register(self, module, hook):
        return module.register_forward_hook(hook)

    def _value(self, output):
        out = output[0] if isinstance(output, tuple) else output
        if not getattr(out, "is_floating_point", lambda: False)():
            return None
        return float(out.detach().abs().max()) if out.numel() else 0.0


def build_kwargs() -> dict:
    """The ``ampsafe.workloads.build("llama", ...)`` options of the recipe."""
    return {k: RECIPE[k] for k in ("seq_len", "batch_size")}


def _recipe_key(seed: int) -> str:
    from .llama import MODEL

    return recipe_key("llama_brink", seed, {**RECIPE, "model": MODEL})


def cache_path(seed: int = 0, cache_dir: Union[str, Path, None] = None) -> Path:
    """Where the brink of ``seed`` is (or will be) cached: ``<dir>/llama_brink_seed<seed>_<recipe>.pt``."""
    return _cache_dir(cache_dir) / f"{_recipe_key(seed)}.pt"


def _probe(workload) -> dict:
    import torch

    with torch.no_grad(), stream_amax(workload.model) as probe:
        workload.model(*workload.example_inputs)
    return dict(probe.amax)


def _snapshot(model, opt, steps: int) -> dict:
    return {
        "model": {name: tensor.detach().clone() for name, tensor in model.state_dict().items()},
        "optimizer": copy.deepcopy(opt.state_dict()),
        "steps": steps,
    }


def _train_to_brink(seed: int) -> tuple[dict, dict]:
    import torch
    import transformers

    from . import build

    workload = build("llama", seed=seed, **build_kwargs())
    model = workload.model
    opt = workload.make_optimizer(RECIPE["lr"])
    history, crossed, warm, started = [], None, None, time.perf_counter()
    for step in range(RECIPE["max_steps"]):
        if step == RECIPE["warm_steps"]:
            warm = _snapshot(model, opt, step)
        with stream_amax(model) as amax:
            loss = workload.loss(workload.batch(step))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        top = max(amax.amax, key=amax.amax.get)
        history.append(
            {"step": step, "loss": loss.item(), "max_layer": top, "max": amax.amax[top], "down": amax.amax[DOWN]}
        )
        if crossed is None and amax.amax[top] > FP16_MAX:
            crossed = {"step": step, "amax_by_layer": dict(amax.amax)}
        if crossed is not None and step >= crossed["step"] + RECIPE["extra_steps"]:
            if _probe(workload).get(DOWN, 0.0) > PROBE_FACTOR * FP16_MAX:
                break
    else:
        raise RuntimeError(
            f"llama seed {seed} did not bring {DOWN} past {PROBE_FACTOR} x 65504 in {RECIPE['max_steps']} steps "
            f"(first crossing: {crossed and crossed['step']})"
        )
    if warm is None or crossed["step"] < RECIPE["warm_steps"]:
        raise RuntimeError(
            f"llama seed {seed} crossed 65504 at step {crossed['step']}, before the warm state's step "
            f"{RECIPE['warm_steps']}: lower RECIPE['warm_steps']"
        )
    by_layer, probe = crossed["amax_by_layer"], _probe(workload)
    leaves = {k: v for k, v in by_layer.items() if not k.startswith("model.layers.") or k.count(".") > 2}
    record = {
        **record_head(seed, RECIPE, crossed, history, started, torch=torch.__version__),
        "transformers": transformers.__version__,
        "first_layer": max(by_layer, key=by_layer.get),
        "over_fp16_at_crossing": over_fp16(by_layer),
        "stream_at_crossing": by_layer[STREAM],
        "largest_module_at_crossing": max(leaves, key=leaves.get),
        "largest_module_amax_at_crossing": max(leaves.values()),
        "probe": {k: v for k, v in sorted(probe.items(), key=lambda kv: -kv[1])[:8]},
        "over_fp16_probe": over_fp16(probe),
        "history": history,
    }
    return {**_snapshot(model, opt, len(history)), "warm": warm}, record


def _load_or_train(seed: int, cache_dir) -> tuple[dict, dict]:
    return load_or_build_torch(cache_path(seed, cache_dir), lambda: _train_to_brink(seed))


def brink_state(seed: int = 0, cache_dir: Union[str, Path, None] = None) -> dict:
    """``{"model": state_dict, "optimizer": Adam state, "steps": n, "warm": {the same after warm_steps}}``."""
    return _load_or_train(seed, cache_dir)[0]


def brink_record(seed: int = 0, cache_dir: Union[str, Path, None] = None) -> dict:
    """How the brink was reached: ``crossed_step``, ``first_layer``, ``over_fp16_at_crossing`` {name: amax}, ..."""
    return _load_or_train(seed, cache_dir)[1]


def brink_start(seed: int = 0, cache_dir: Union[str, Path, None] = None, *, warm: bool = False):
    """``(workload, optimizer, first)`` at the brink (``warm=True``: after ``warm_steps``, still in range): the
    recipe resumed, batch ``first + i`` is next."""
    from . import build

    state = brink_state(seed, cache_dir)
    if warm:
        state = state["warm"]
    workload = build("llama", seed=seed, **build_kwargs())
    workload.model.load_state_dict(state["model"], strict=True)
    workload.model.train()
    opt = workload.make_optimizer(RECIPE["lr"])
    opt.load_state_dict(state["optimizer"])
    return workload, opt, state["steps"]


if __name__ == "__main__":  # python -m ampsafe.workloads.llama_brink [seed]: build (or show) the cached brink
    import sys

    _rec = brink_record(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    print(f"cache: {cache_path(_rec['seed'])}")
    print(f"crossed 65504 at step {_rec['crossed_step']} in {_rec['first_layer']}: {_rec['over_fp16_at_crossing']}")
    print(f"largest module then: {_rec['largest_module_at_crossing']} {_rec['largest_module_amax_at_crossing']:.0f}")
    print(f"stopped after {_rec['steps_trained']} steps; probe over 65504: {_rec['over_fp16_probe']}")
