"""The ``t5`` "brink" checkpoint: HF T5 trained in FP32 until ``DenseReluDense.wo`` leaves float16's range.

How the recipe was found: a 2-layer T5 (``d_model`` 128, ``d_ff`` 512, 4 heads of 32, no dropout) trained in
FP32 with Adam has ``decoder.block.1.layer.2.DenseReluDense.wo`` as its largest-output module from the first steps
on, and that output grows with the learning rate (on uniform random tokens: ~240 at step 140 with lr 1e-2, ~2.4e3
with lr 5e-2, ~9e3 with lr 0.1, ~4.6e4 with lr 0.2, each a plateau; the loss stays at ``ln 128``). On the Zipf
copy task of :mod:`.t5` the loss falls (to about 3.9, the data's unigram entropy) and at lr 0.3 ``wo`` passes
65504 at step 14, but the attention's QK logits (unscaled in T5) pass it at step 13. With 16 heads of 8 and
``d_ff`` 2048 (the sizes of :data:`.t5.MODEL`) at lr 0.2, ``wo`` grows ~8e3 per step and passes 65504 at step
10-12 (seeds 0-2: 71129, 66600, 69546, the size of HF issue #5651's 66246), while the largest QK logit is
15e3-20e3, about 2 bits below (measured on a 2-core AVX-512 Xeon, torch 2.14). At lr 0.15 it crosses with 66238 at
step 21 on seed 0, but on seed 2 (AVX2 kernels) only at step 33 and then stalls short of the probe.
Nothing is injected: Adam's per-parameter steps of size ~lr grow the decoder's last feed-forward (the RMSNorm
weight before it, ``wi`` and ``wo`` together), whose output is added to the float32 residual stream that T5's
pre-norm blocks never normalize. Under float16 AMP that output is the first value stored in float16 past 65504;
HF's maintainers found the same module by hand in the report.

Training stops once the forward on ``example_inputs`` has ``wo`` past ``PROBE_FACTOR`` x 65504, at least
``extra_steps`` steps after the first crossing; model and Adam state, and a record of where and when it crossed,
are cached under ``$AMPSAFE_CACHE`` (a few seconds of CPU, shared between processes by a file lock).

    w, opt, first = brink_start(seed=0)   # build("t5", seed=seed) with the brink's model and Adam state loaded
    rec = brink_record(seed=0)        # {"crossed_step", "first_layer", "over_fp16_at_crossing", "probe", ...}
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

from .amax import FP16_MAX, over_fp16, record_head
from .brinks import TorchBrink, probe, resume, snapshot, summary, train_past
from .frcnn_brink import leaf_amax  # every leaf module's output abs-max, the same probe as frcnn's

__all__ = [
    "FP16_MAX",
    "PROBE_FACTOR",
    "RECIPE",
    "WO",
    "build_kwargs",
    "recipe_optimizer",
    "leaf_amax",
    "brink_state",
    "brink_record",
    "brink_start",
    "cache_path",
    "qk_logits_amax",
]

PROBE_FACTOR = 1.1  # the brink's wo output on example_inputs is this far past 65504 (float16 rounds at 0.05%)
RECIPE = {
    "seq_len": 32,
    "batch_size": 8,
    "optimizer": "adam",
    "lr": 0.2,
    "max_steps": 40,
    "extra_steps": 2,
    "warm_steps": 6,
    "version": 1,
}
# the module the recipe drives out of float16's range (HF issue #5651's module, in the last decoder block)
WO = "decoder.block.1.layer.2.DenseReluDense.wo"


def build_kwargs() -> dict:
    """The ``ampsafe_lab.workloads.build("t5", ...)`` options of the recipe."""
    return {k: RECIPE[k] for k in ("seq_len", "batch_size")}


def recipe_optimizer(model, lr: float | None = None):
    """The recipe's Adam (no weight decay)."""
    import torch

    return torch.optim.Adam(model.parameters(), lr=RECIPE["lr"] if lr is None else lr)


def cache_path(seed: int = 0, cache_dir: Union[str, Path, None] = None) -> Path:
    """Where the brink of ``seed`` is (or will be) cached: ``<dir>/t5_brink_seed<seed>_<recipe>.pt``."""
    return _BRINK.path(seed, cache_dir)


def qk_logits_amax(workload) -> float:
    """The largest |q . k| of any attention in ``model(*example_inputs)`` (float32, no grad): T5's attention logits
    before the position bias and the mask (T5 does not scale them by ``1/sqrt(d_kv)``)."""
    import torch

    model, heads, width = workload.model, workload.model.config.num_heads, workload.model.config.d_kv
    outputs, handles = {}, []
    for name, module in model.named_modules():
        if name.rpartition(".")[2] in ("q", "k") and "Attention" in name:
            handles.append(module.register_forward_hook(lambda m, i, o, n=name: outputs.__setitem__(n, o.detach())))
    try:
        with torch.no_grad():
            model(*workload.example_inputs)
    finally:
        for handle in handles:
            handle.remove()
    best = 0.0
    for name, q in outputs.items():
        if name.endswith(".q"):
            k = outputs[name[:-1] + "k"]
            q = q.view(q.shape[0], q.shape[1], heads, width).transpose(1, 2)
            k = k.view(k.shape[0], k.shape[1], heads, width).transpose(1, 2)
            best = max(best, float((q @ k.transpose(-1, -2)).abs().max()))
    return best


def _train_to_brink(seed: int) -> tuple[dict, dict]:
    import torch

    from . import build

    workload = build("t5", seed=seed, **build_kwargs())
    opt = recipe_optimizer(workload.model)
    run = train_past(workload, opt, leaf_amax, recipe=RECIPE, seed=seed, factor=PROBE_FACTOR, target=WO)
    by_layer, probed = run.crossed["amax_by_layer"], probe(workload, leaf_amax)
    record = {
        **record_head(seed, RECIPE, run.crossed, run.history, run.started, torch=torch.__version__),
        "first_layer": max(by_layer, key=by_layer.get),
        "over_fp16_at_crossing": over_fp16(by_layer),
        "probe": {k: v for k, v in sorted(probed.items(), key=lambda kv: -kv[1])[:8]},
        "over_fp16_probe": {k: v for k, v in probed.items() if v > FP16_MAX},
        "qk_logits_probe": qk_logits_amax(workload),
        "history": run.history,
    }
    return {**snapshot(workload.model, opt, len(run.history)), "warm": run.warm}, record


_BRINK = TorchBrink("t5_brink", RECIPE, _train_to_brink, model=".t5")


def brink_state(seed: int = 0, cache_dir: Union[str, Path, None] = None) -> dict:
    """``{"model": state_dict, "optimizer": Adam state, "steps": n, "warm": {the same after warm_steps}}``;
    trained once (~15 steps, seconds), then cached."""
    return _BRINK.load_or_train(seed, cache_dir)[0]


def brink_record(seed: int = 0, cache_dir: Union[str, Path, None] = None) -> dict:
    """How the brink was reached: ``crossed_step``, ``first_layer``, ``over_fp16_at_crossing`` {layer: amax}, ..."""
    return _BRINK.load_or_train(seed, cache_dir)[1]


def brink_start(seed: int = 0, cache_dir: Union[str, Path, None] = None, patch_fn=None, *, warm: bool = False):
    """``(workload, optimizer, first)`` at the brink: the recipe resumed, batch ``first + i`` is next.

    ``warm=True``: at the recipe's state after ``RECIPE["warm_steps"]`` FP32 steps instead, still in float16's
    range (``wo`` about half of 65504), where a run under AMP crosses 65504 by itself a few steps later.
    ``patch_fn(workload)``, when given, runs after the weights are loaded and before the optimizer is built
    (patches keep parameter identity, so the Adam state loads either way).
    """
    state = brink_state(seed, cache_dir)
    if warm:
        state = state["warm"]
    workload, opt = resume("t5", seed, build_kwargs(), state, lambda w: recipe_optimizer(w.model), patch_fn)
    return workload, opt, state["steps"]


if __name__ == "__main__":  # python -m ampsafe_lab.workloads.t5_brink [seed]: build (or show) the cached brink
    import sys

    _rec = brink_record(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    print(summary(_rec, cache_path(_rec["seed"])))
    print(f"largest QK logit at the brink: {_rec['qk_logits_probe']:.0f}")
