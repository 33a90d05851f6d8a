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
    brink_start(seed=0, warm=True)        # the same after warm_steps: in range, float16 AMP crosses by itself
    brink_record(seed=0)["first_layer"]   # STREAM; also "largest_module_at_crossing" (DOWN), "probe", ...
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

from .amax import FP16_MAX, AmaxRecorder, over_fp16, record_head
from .brinks import TorchBrink, probe, resume, snapshot, summary, train_past

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
    """The ``ampsafe_lab.workloads.build("llama", ...)`` options of the recipe."""
    return {k: RECIPE[k] for k in ("seq_len", "batch_size")}


def cache_path(seed: int = 0, cache_dir: Union[str, Path, None] = None) -> Path:
    """Where the brink of ``seed`` is (or will be) cached: ``<dir>/llama_brink_seed<seed>_<recipe>.pt``."""
    return _BRINK.path(seed, cache_dir)


def _down(amax: dict) -> dict:
    """What a step's history adds: ``down_proj``'s abs-max, which trails the stream's."""
    return {"down": amax[DOWN]}


def _train_to_brink(seed: int) -> tuple[dict, dict]:
    import torch
    import transformers

    from . import build

    workload = build("llama", seed=seed, **build_kwargs())
    opt = workload.make_optimizer(RECIPE["lr"])
    run = train_past(
        workload, opt, stream_amax, recipe=RECIPE, seed=seed, factor=PROBE_FACTOR, target=DOWN, extra=_down
    )
    by_layer, probed = run.crossed["amax_by_layer"], probe(workload, stream_amax)
    leaves = {k: v for k, v in by_layer.items() if not k.startswith("model.layers.") or k.count(".") > 2}
    record = {
        **record_head(seed, RECIPE, run.crossed, run.history, run.started, torch=torch.__version__),
        "transformers": transformers.__version__,
        "first_layer": max(by_layer, key=by_layer.get),
        "over_fp16_at_crossing": over_fp16(by_layer),
        "stream_at_crossing": by_layer[STREAM],
        "largest_module_at_crossing": max(leaves, key=leaves.get),
        "largest_module_amax_at_crossing": max(leaves.values()),
        "probe": {k: v for k, v in sorted(probed.items(), key=lambda kv: -kv[1])[:8]},
        "over_fp16_probe": over_fp16(probed),
        "history": run.history,
    }
    return {**snapshot(workload.model, opt, len(run.history)), "warm": run.warm}, record


_BRINK = TorchBrink("llama_brink", RECIPE, _train_to_brink, model=".llama")


def brink_state(seed: int = 0, cache_dir: Union[str, Path, None] = None) -> dict:
    """``{"model": state_dict, "optimizer": Adam state, "steps": n, "warm": {the same after warm_steps}}``."""
    return _BRINK.load_or_train(seed, cache_dir)[0]


def brink_record(seed: int = 0, cache_dir: Union[str, Path, None] = None) -> dict:
    """How the brink was reached: ``crossed_step``, ``first_layer``, ``over_fp16_at_crossing`` {name: amax}, ..."""
    return _BRINK.load_or_train(seed, cache_dir)[1]


def brink_start(seed: int = 0, cache_dir: Union[str, Path, None] = None, *, warm: bool = False):
    """``(workload, optimizer, first)`` at the brink (``warm=True``: after ``warm_steps``, still in range): the
    recipe resumed, batch ``first + i`` is next."""
    state = brink_state(seed, cache_dir)
    if warm:
        state = state["warm"]
    workload, opt = resume("llama", seed, build_kwargs(), state, lambda w: w.make_optimizer(RECIPE["lr"]))
    return workload, opt, state["steps"]


if __name__ == "__main__":  # python -m ampsafe_lab.workloads.llama_brink [seed]: build (or show) the cached brink
    import sys

    _rec = brink_record(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    _then = f"largest module then: {_rec['largest_module_at_crossing']} {_rec['largest_module_amax_at_crossing']:.0f}"
    print(summary(_rec, cache_path(_rec["seed"]), _then))
