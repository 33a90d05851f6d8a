"""The "brink" checkpoint: DBNet trained in FP32 just until an activation leaves float16's range.

Recipe (the seed report's setting, shortened): random init, 128x128 synthetic crops, batch 8, Adam lr 1e-2 without
weight decay. Within a few dozen steps the DBFPN concat grows (no normalization after its eight convs) and the
head's first conv, which multiplies it, passes 65504 while FP32 training is perfectly healthy. Training stops at
the first step whose forward exceeds float16's max anywhere (measured with forward hooks on every sublayer), plus
``extra_steps``; the state and a record of where and when it crossed are cached under ``.cache/ampsafe/``.

    state = brink_state(seed=0)         # {name: paddle.Tensor}, loads strictly into build("dbnet").model
    model = brink_model(seed=0)         # that model, train mode
    rec = brink_record(seed=0)          # {"crossed_step", "first_layer", "watched_at_crossing", "probe", ...}
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Union

import numpy as np

from ..amax import FP16_MAX, AmaxRecorder, over_fp16, record_head
from ..cache import cache_dir as _cache_dir
from ..cache import load_or_build, recipe_key

__all__ = [
    "FP16_MAX",
    "RECIPE",
    "WATCHED",
    "brink_state",
    "brink_model",
    "brink_workload",
    "brink_record",
    "MONITOR_RECIPE",
    "train_monitor_recipe",
    "layer_amax",
    "cache_path",
]

RECIPE = {
    "config": "det_mv3_db",
    "image_size": 128,
    "batch_size": 8,
    "lr": 1e-2,
    "max_steps": 60,
    "extra_steps": 2,
    "version": 3,
}


# The headroom monitor's recipe: Adam's lr ramped linearly from 0 to 2e-2 over the 30 steps of interest, so the
# activations cross 65504 late enough for a monitor that looks every 10 steps, then climb well past it. Recipes
# at a constant lr plateau just below 65504 (96 px, lr 8e-3, 40 steps: seed 0 crosses at step 17, seeds 1 and 2
# peak at 60416 and 65247 and never cross; 128 px, lr 1e-2 after a 15-step warmup: seeds 0 and 1 hover at
# 46-65k for 5-10 steps before crossing at 27 and 30), so they cross on one CPU and not on the next.
# Measured (AVX2-only AMD EPYC; bench/results/margins.md adds other ISA settings): seeds 0/1/2 cross at steps
# 25/25/28 and reach 1.4-1.7x 65504 within 4 steps; the abs-max is 29-49k at step 20 (the monitor's warning,
# 5 steps before the crossing) and 4.0-4.1k at step 10; the horizon of 40 steps leaves 12 steps to spare.
MONITOR_RECIPE = {"config": "det_mv3_db", "image_size": 128, "batch_size": 8, "lr": 2e-2, "warmup_steps": 30}


def train_monitor_recipe(seed: int, steps: int, *, watch=None, stop_after: int | None = None) -> list[dict]:
    """FP32 training on :data:`MONITOR_RECIPE`; returns, per step, the float32 abs-max of every sublayer.

    ``watch(model)`` gives a context manager held around the loop (the test's ``ampsafe.watch``). Training stops
    ``stop_after`` steps after the first step whose forward leaves float16's range (None: run all ``steps``).
    """
    import contextlib

    import paddle

    from . import build

    r = MONITOR_RECIPE
    workload = build(seed, config=r["config"], image_size=r["image_size"], batch_size=r["batch_size"])
    schedule = paddle.optimizer.lr.LinearWarmup(r["lr"], r["warmup_steps"], 0.0, r["lr"])
    optimizer = workload.make_optimizer(schedule)
    model, per_step, crossed = workload.model, [], None
    with watch(model) if watch else contextlib.nullcontext(), layer_amax(model) as probe:
        for step in range(steps):
            probe.reset()
            workload.loss(workload.batch(step)).backward()
            optimizer.step()
            optimizer.clear_grad()
            schedule.step()
            per_step.append(dict(probe.amax))
            if crossed is None and max(probe.amax.values()) > FP16_MAX:
                crossed = step
            if crossed is not None and stop_after is not None and step >= crossed + stop_after:
                break
    return per_step


class layer_amax(AmaxRecorder):
    """Context manager: forward post-hooks on every sublayer record the float32 abs-max of its outputs.

    ``amax`` maps sublayer path (as ``named_sublayers`` spells it) to the largest value seen since the last
    ``reset()``, in the order the layers first ran; tensors nested in tuples, lists and dicts count.
    """

    def _modules(self):
        return self.model.named_sublayers()

    def _register(self, module, hook):
        return module.register_forward_post_hook(hook)

    def _value(self, output):
        return _max_abs(output)


def _max_abs(output) -> float | None:
    import paddle

    if isinstance(output, paddle.Tensor):
        if output.dtype not in (paddle.float32, paddle.float16, paddle.float64, paddle.bfloat16):
            return None
        return float(paddle.abs(output.detach()).max())
    if isinstance(output, dict):
        output = list(output.values())
    if isinstance(output, (list, tuple)):
        values = [v for v in (_max_abs(item) for item in output) if v is not None]
        return max(values) if values else None
    return None


def cache_path(seed: int = 0, cache_dir: Union[str, Path, None] = None) -> Path:
    """Where the brink state of ``seed`` is (or will be) cached: ``<dir>/dbnet_brink_seed<seed>_<recipe>.npz``."""
    return _cache_dir(cache_dir) / f"{recipe_key('dbnet_brink', seed, RECIPE)}.npz"


def _train_to_brink(seed: int) -> tuple[dict, dict]:
    from . import build

    workload = build(seed, config=RECIPE["config"], image_size=RECIPE["image_size"], batch_size=RECIPE["batch_size"])
    model = workload.model
    optimizer = workload.make_optimizer(RECIPE["lr"])
    history, crossed, started = [], None, time.perf_counter()
    with layer_amax(model) as probe:
        for step in range(RECIPE["max_steps"]):
            probe.reset()
            loss = workload.loss(workload.batch(step))
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
            top_layer = max(probe.amax, key=probe.amax.get)
            history.append({"step": step, "loss": float(loss), "max_layer": top_layer, "max": probe.amax[top_layer]})
            if crossed is None and probe.amax[top_layer] > FP16_MAX:
                crossed = {"step": step, "amax_by_layer": dict(probe.amax)}
            if crossed is not None and step >= crossed["step"] + RECIPE["extra_steps"]:
                break
    if crossed is None:
        raise RuntimeError(f"DBNet seed {seed} did not exceed float16's range in {RECIPE['max_steps']} steps")
    over = over_fp16(crossed["amax_by_layer"])
    record = {
        **record_head(seed, RECIPE, crossed, history, started),
        "first_layer": next(name for name, value in crossed["amax_by_layer"].items() if value > FP16_MAX),
        "watched_at_crossing": {name: crossed["amax_by_layer"].get(name) for name in WATCHED},
        "over_fp16_at_crossing": over,
        "amax_by_layer_at_crossing": crossed["amax_by_layer"],
        "history": history,
    }
    state = {name: tensor.numpy().copy() for name, tensor in model.state_dict().items()}
    record["probe"] = _probe(workload)
    return state, record


def _probe(workload) -> dict:
    """Abs-max of the watched layers on ``example_inputs`` (batch 0) in train and eval mode, no update kept."""
    import paddle

    model = workload.model
    saved = {name: tensor.numpy().copy() for name, tensor in model.state_dict().items()}
    result = {}
    try:
        with paddle.no_grad(), layer_amax(model) as probe:
            for mode in ("train", "eval"):
                model.train() if mode == "train" else model.eval()
                probe.reset()
                model(*workload.example_inputs)
                result[mode] = {name: probe.amax[name] for name in WATCHED if name in probe.amax}
    finally:
        model.train()
        model.set_state_dict({name: paddle.to_tensor(value) for name, value in saved.items()})
    return result


# the layers the issue names: the DBFPN concat and the two head convs that consume it
WATCHED = ("neck", "head.binarize.conv1", "head.thresh.conv1")


def _load_or_train(seed: int, cache_dir) -> tuple[dict, dict]:
    path = cache_path(seed, cache_dir)
    meta = path.with_suffix(".json")

    def load() -> tuple[dict, dict]:
        with np.load(path) as arrays:
            return {k: arrays[k] for k in arrays.files}, json.loads(meta.read_text())

    def save(value: tuple[dict, dict], tmp: Path) -> None:
        np.savez(tmp, **value[0])
        meta.write_text(json.dumps(value[1], indent=1))

    return load_or_build(
        path, load=load, build=lambda: _train_to_brink(seed), save=save, ready=lambda: path.is_file() and meta.is_file()
    )


def brink_state(seed: int = 0, cache_dir: Union[str, Path, None] = None) -> dict:
    """The brink state_dict ({name: paddle.Tensor}); trained once (~1 min on 2 cores), then read from the cache."""
    import paddle

    state, _ = _load_or_train(seed, cache_dir)
    return {name: paddle.to_tensor(value) for name, value in state.items()}


def brink_record(seed: int = 0, cache_dir: Union[str, Path, None] = None) -> dict:
    """How the brink was reached: ``crossed_step``, ``first_layer``, ``over_fp16_at_crossing`` {layer: amax}, loss history."""
    return _load_or_train(seed, cache_dir)[1]


def brink_workload(seed: int = 0, cache_dir: Union[str, Path, None] = None):
    """``build("dbnet", seed=seed)`` (the recipe's config and sizes) with the brink state loaded, train mode."""
    from . import build

    workload = build(seed, config=RECIPE["config"], image_size=RECIPE["image_size"], batch_size=RECIPE["batch_size"])
    missing, unexpected = workload.model.set_state_dict(brink_state(seed, cache_dir))
    if missing or unexpected:
        raise RuntimeError(f"brink state does not fit the model: missing {missing}, unexpected {unexpected}")
    return workload


def brink_model(seed: int = 0, cache_dir: Union[str, Path, None] = None):
    """The DBNet model (paddle.nn.Layer, train mode) at the brink: its forward exceeds 65504 in float32."""
    return brink_workload(seed, cache_dir).model


if __name__ == "__main__":  # python -m ampsafe_lab.workloads.dbnet.brink [seed]: build (or show) the cached brink
    import sys

    _rec = brink_record(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    print(f"cache: {cache_path(_rec['seed'])}")
    print(f"crossed 65504 at step {_rec['crossed_step']} in {_rec['first_layer']}: {_rec['watched_at_crossing']}")
