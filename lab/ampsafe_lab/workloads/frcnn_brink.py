"""The ``frcnn`` "brink" checkpoint: Faster R-CNN trained in FP32 until its box head leaves float16's range.

Recipe (what a user training a detector from scratch with DBNet's optimizer might do): torchvision
``fasterrcnn_mobilenet_v3_large_320_fpn``, random init (no pretrained backbone), 160x160 synthetic shapes, batch 2,
3 classes, Adam lr 1e-2 without weight decay and torchvision's detection-reference linear warmup (factor 1e-3 over
the first 10 steps). Raw 0-255 pixels are not the cause (the stem's BatchNorm absorbs them): Adam's first full-lr
steps grow the unnormalized RoI box head (``roi_heads.box_head.fc6`` -> ``fc7``, both Linear, no normalization)
and the RPN head conv, and ``fc6``/``fc7`` pass 65504 within ~15 steps while the FP32 loss keeps falling.
Training stops once the model's forward on ``example_inputs`` (batch 0, RoI sampling seeded) exceeds
``PROBE_FACTOR`` x 65504, after at least ``extra_steps`` steps past the first crossing; the state and a record of
where and when it crossed are cached under ``.cache/ampsafe/``.

    w = brink_workload(seed=0)     # build("frcnn", **sizes) with the brink state loaded, train mode
    rec = brink_record(seed=0)     # {"crossed_step", "first_layer", "over_fp16_at_crossing", "probe", ...}
    opt, sched = recipe_optimizer(w.model)   # the recipe's Adam + warmup, for continuing to train
    w, opt, sched = warm_start(seed=0)       # the recipe resumed after its FP32 warmup (the demo starts here)
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

from .amax import FP16_MAX, AmaxRecorder, over_fp16, record_head
from .brinks import TorchBrink, summary, train_past
from .cache import load_or_build

__all__ = [
    "FP16_MAX",
    "PROBE_FACTOR",
    "RECIPE",
    "WATCHED",
    "build_kwargs",
    "recipe_optimizer",
    "leaf_amax",
    "seeded_forward",
    "brink_state",
    "brink_record",
    "brink_workload",
    "cache_path",
    "warm_state",
    "warm_start",
]

PROBE_FACTOR = 2.0  # the probe must exceed 2 x 65504: one bit of margin for float16's different proposals
RECIPE = {
    "backbone": "mobilenet",
    "image_size": 160,
    "batch_size": 2,
    "num_classes": 3,
    "optimizer": "adam",
    "lr": 1e-2,
    "weight_decay": 0.0,
    "warmup_steps": 10,
    "warmup_factor": 1e-3,
    "max_steps": 40,
    "extra_steps": 2,
    "version": 1,
}
# the unnormalized layers the recipe drives out of range: RoI box head and the RPN head conv
WATCHED = (
    "roi_heads.box_head.fc6",
    "roi_heads.box_head.fc7",
    "roi_heads.box_predictor.cls_score",
    "roi_heads.box_predictor.bbox_pred",
    "rpn.head.conv.0.0",
    "rpn.head.cls_logits",
)


def build_kwargs() -> dict:
    """The ``ampsafe_lab.workloads.build("frcnn", ...)`` options of the recipe."""
    return {k: RECIPE[k] for k in ("backbone", "image_size", "batch_size", "num_classes")}


def recipe_optimizer(model, lr: float | None = None, warmup_steps: int | None = None):
    """``(Adam, LinearLR warmup)`` as the recipe trains; call ``scheduler.step()`` after each ``optimizer.step()``."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=RECIPE["lr"] if lr is None else lr, weight_decay=RECIPE["weight_decay"])
    warm = RECIPE["warmup_steps"] if warmup_steps is None else warmup_steps
    factor = RECIPE["warmup_factor"] if warm > 0 else 1.0
    sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=factor, total_iters=max(warm, 1))
    return opt, sched


class leaf_amax(AmaxRecorder):
    """Context manager: forward hooks on every leaf module record the float32 abs-max of its tensor output.

    ``amax`` maps module path to the largest value since the last ``reset()``, in the order modules first ran.
    """

    def _modules(self):
        return ((name, m) for name, m in self.model.named_modules() if name and not any(True for _ in m.children()))

    def _register(self, module, hook):
        return module.register_forward_hook(hook)

    def _value(self, output):
        if not getattr(output, "is_floating_point", lambda: False)():
            return None
        return float(output.detach().abs().max()) if output.numel() else 0.0


def seeded_forward(model, inputs, seed: int = 0):
    """``model(*inputs)`` with torch's RNG seeded (RoI sampling is random in train mode) and then restored."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return model(*inputs)


def cache_path(seed: int = 0, cache_dir: Union[str, Path, None] = None) -> Path:
    """Where the brink state of ``seed`` is (or will be) cached: ``<dir>/frcnn_brink_seed<seed>_<recipe>.pt``."""
    return _BRINK.path(seed, cache_dir)


def _probe(workload, seed: int) -> dict:
    """Leaf abs-max on ``example_inputs`` (train mode, RoI sampling seeded; and eval mode), no grad."""
    import torch

    model = workload.model
    result = {}
    try:
        with torch.no_grad(), leaf_amax(model) as probe:
            for mode in ("train", "eval"):
                model.train(mode == "train")
                probe.reset()
                seeded_forward(model, workload.example_inputs if mode == "train" else workload.example_inputs[:1], seed)
                result[mode] = dict(probe.amax)
    finally:
        model.train()
    return result


BUILD_THREADS = 2  # the brink's trajectory depends on torch's thread count (1 thread: crossing at step 18, not 14)


def _train_to_brink(seed: int) -> tuple[dict, dict]:
    """Trained with :data:`BUILD_THREADS` torch threads whatever the calling process set (a test worker may have
    set 1), so that every build of a seed is the same brink on a given machine's kernels."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(BUILD_THREADS)
    try:
        return _train_threads_set(seed)
    finally:
        torch.set_num_threads(threads)


def _train_threads_set(seed: int) -> tuple[dict, dict]:
    import torch

    from . import build

    workload = build("frcnn", seed=seed, **build_kwargs())
    opt, sched = recipe_optimizer(workload.model)
    torch.manual_seed(seed)
    run = train_past(
        workload,
        opt,
        leaf_amax,
        recipe=RECIPE,
        seed=seed,
        factor=PROBE_FACTOR,
        past=lambda: max(_probe(workload, seed)["train"].values()) > PROBE_FACTOR * FP16_MAX,
        scheduler=sched,
    )
    by_layer = run.crossed["amax_by_layer"]
    over = over_fp16(by_layer)
    probe = _probe(workload, seed)
    record = {
        **record_head(seed, RECIPE, run.crossed, run.history, run.started, torch=torch.__version__),
        "first_layer": next(name for name, value in by_layer.items() if value > FP16_MAX),
        "over_fp16_at_crossing": over,
        "watched_at_crossing": {name: by_layer.get(name) for name in WATCHED},
        "watched_probe": {mode: {n: probe[mode].get(n) for n in WATCHED} for mode in probe},
        "over_fp16_probe": {mode: {k: v for k, v in probe[mode].items() if v > FP16_MAX} for mode in probe},
        "history": run.history,
    }
    state = {name: tensor.detach().clone() for name, tensor in workload.model.state_dict().items()}
    return state, record


_BRINK = TorchBrink("frcnn_brink", RECIPE, _train_to_brink)


def brink_state(seed: int = 0, cache_dir: Union[str, Path, None] = None) -> dict:
    """The brink state_dict ({name: torch.Tensor}); trained once (~20 steps, ~1 min on 2 cores), then cached."""
    return _BRINK.load_or_train(seed, cache_dir)[0]


def brink_record(seed: int = 0, cache_dir: Union[str, Path, None] = None) -> dict:
    """How the brink was reached: ``crossed_step``, ``first_layer``, ``over_fp16_at_crossing`` {layer: amax}, ..."""
    return _BRINK.load_or_train(seed, cache_dir)[1]


def brink_workload(seed: int = 0, cache_dir: Union[str, Path, None] = None):
    """``build("frcnn", seed=seed, **build_kwargs())`` with the brink state loaded strictly, train mode."""
    from . import build

    workload = build("frcnn", seed=seed, **build_kwargs())
    workload.model.load_state_dict(brink_state(seed, cache_dir), strict=True)
    workload.model.train()
    return workload


def _warm_path(seed: int, cache_dir) -> Path:
    return cache_path(seed, cache_dir).with_name(f"{_BRINK.key(seed)}_warm.pt")


def _train_warmup(seed: int) -> dict:
    import torch

    from . import build

    workload = build("frcnn", seed=seed, **build_kwargs())
    opt, sched = recipe_optimizer(workload.model)
    torch.manual_seed(seed)
    for step in range(RECIPE["warmup_steps"]):
        workload.loss(workload.batch(step)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
    return {
        "model": workload.model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "steps": RECIPE["warmup_steps"],
    }


def warm_state(seed: int = 0, cache_dir: Union[str, Path, None] = None) -> dict:
    """The recipe's state after its FP32 warmup steps: ``{"model", "optimizer", "scheduler", "steps"}``, cached.

    Why: the warmup steps are the same in every precision (nothing is near 65504 yet), so runs that compare
    precisions can share them and spend their time where they differ.
    """
    import torch

    path = _warm_path(seed, cache_dir)
    return load_or_build(
        path,
        load=lambda: torch.load(path, map_location="cpu", weights_only=True),
        build=lambda: _train_warmup(seed),
        save=torch.save,
    )


def warm_start(seed: int = 0, cache_dir: Union[str, Path, None] = None, patch_fn=None):
    """``(workload, optimizer, scheduler)`` resumed after the warmup; batch ``warm_state()["steps"] + i`` is next.

    ``patch_fn(workload)``, when given, runs after the weights are loaded and before the optimizer is built
    (patches keep parameter identity, so the optimizer state loads either way).
    """
    from . import build

    state = warm_state(seed, cache_dir)
    workload = build("frcnn", seed=seed, **build_kwargs())
    workload.model.load_state_dict(state["model"], strict=True)
    workload.model.train()
    if patch_fn is not None:
        patch_fn(workload)
    opt, sched = recipe_optimizer(workload.model)
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    return workload, opt, sched


if __name__ == "__main__":  # python -m ampsafe_lab.workloads.frcnn_brink [seed]: build (or show) the cached brink
    import sys

    _rec = brink_record(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    print(summary(_rec, cache_path(_rec["seed"])))
