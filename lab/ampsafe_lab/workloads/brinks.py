"""What the torch brinks (``t5``, ``llama``, ``frcnn``) share: their cache entry, their training loop, their resume.

Why one place: each brink trains its recipe in float32 until one module's output is past a multiple of 65504 and
caches the state beside a JSON record, keyed by the brink's name, the seed and a hash of the recipe. A brink module
says only what differs (its recipe, its probe, what its record holds); the key, the file, the loop and the resume
are written here once, so the brinks cannot drift apart in how they are cached or trained.
"""

from __future__ import annotations

import copy
import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

from .amax import FP16_MAX
from .cache import cache_dir as _cache_dir
from .cache import load_or_build_torch, recipe_key

__all__ = ["TorchBrink", "Trained", "snapshot", "probe", "train_past", "resume", "summary"]


@dataclass(frozen=True)
class TorchBrink:
    """A brink's cache entry: ``<dir>/<name>_seed<seed>_<recipe hash>.pt`` and its ``.json`` record.

    The key hashes ``recipe``, with ``"model"``: the ``MODEL`` config of the workload module ``model`` (relative
    to this package, imported when the key is first needed) where given. ``train(seed) -> (state, record)`` runs
    once per key, across processes (see :mod:`.cache`).
    """

    name: str
    recipe: dict
    train: Callable[[int], tuple[Any, dict]]
    model: str | None = None

    def key(self, seed: int) -> str:
        recipe = self.recipe
        if self.model is not None:
            recipe = {**recipe, "model": importlib.import_module(self.model, __package__).MODEL}
        return recipe_key(self.name, seed, recipe)

    def path(self, seed: int = 0, cache_dir: Union[str, Path, None] = None) -> Path:
        return _cache_dir(cache_dir) / f"{self.key(seed)}.pt"

    def load_or_train(self, seed: int = 0, cache_dir: Union[str, Path, None] = None) -> tuple[Any, dict]:
        return load_or_build_torch(self.path(seed, cache_dir), lambda: self.train(seed))


def snapshot(model, opt, steps: int) -> dict:
    """``{"model", "optimizer", "steps"}``: copies, so training on does not change them."""
    return {
        "model": {name: tensor.detach().clone() for name, tensor in model.state_dict().items()},
        "optimizer": copy.deepcopy(opt.state_dict()),
        "steps": steps,
    }


def probe(workload, recorder) -> dict:
    """``recorder``'s abs-max of each module in ``model(*example_inputs)``, no grad."""
    import torch

    with torch.no_grad(), recorder(workload.model) as amax:
        workload.model(*workload.example_inputs)
    return dict(amax.amax)


@dataclass
class Trained:
    """What :func:`train_past` saw: a history entry per step, the first crossing (``{"step", "amax_by_layer"}``),
    the :func:`snapshot` after ``recipe["warm_steps"]`` (None without), and its ``time.perf_counter()`` start."""

    history: list
    crossed: dict
    warm: dict | None
    started: float


def train_past(
    workload,
    opt,
    recorder,
    *,
    recipe: dict,
    seed: int,
    factor: float,
    target: str = "its probe",
    past: Callable[[], bool] | None = None,
    scheduler=None,
    extra: Callable[[dict], dict] | None = None,
) -> Trained:
    """Train ``workload`` with ``opt`` (and ``scheduler``), batch ``i`` at step ``i``, recording each step's
    abs-max with ``recorder(model)``, until the :func:`probe` of ``target`` is past ``factor`` x 65504 (or
    ``past()`` holds) at least ``recipe["extra_steps"]`` steps after the first step whose abs-max passed 65504.
    ``extra(amax)`` adds to a step's history entry. Raises when ``recipe["max_steps"]`` do not get there, or when
    the crossing comes before ``recipe["warm_steps"]``."""
    model, warm_steps, label = workload.model, recipe.get("warm_steps"), workload.name

    def target_past() -> bool:
        return probe(workload, recorder).get(target, 0.0) > factor * FP16_MAX

    past = past or target_past
    history, crossed, warm, started = [], None, None, time.perf_counter()
    for step in range(recipe["max_steps"]):
        if step == warm_steps:
            warm = snapshot(model, opt, step)
        with recorder(model) as amax:
            loss = workload.loss(workload.batch(step))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
        top = max(amax.amax, key=amax.amax.get)
        entry = {"step": step, "loss": loss.item(), "max_layer": top, "max": amax.amax[top]}
        history.append({**entry, **extra(amax.amax)} if extra else entry)
        if crossed is None and amax.amax[top] > FP16_MAX:
            crossed = {"step": step, "amax_by_layer": dict(amax.amax)}
        if crossed is not None and step >= crossed["step"] + recipe["extra_steps"] and past():
            break
    else:
        raise RuntimeError(
            f"{label} seed {seed} did not bring {target} past {factor} x 65504 in {recipe['max_steps']} steps "
            f"(first crossing: {crossed and crossed['step']})"
        )
    if warm_steps is not None and (warm is None or crossed["step"] < warm_steps):
        raise RuntimeError(
            f"{label} seed {seed} crossed 65504 at step {crossed['step']}, before the warm state's step "
            f"{warm_steps}: lower RECIPE['warm_steps']"
        )
    return Trained(history, crossed, warm, started)


def resume(name: str, seed: int, build_kwargs: dict, state: dict, make_optimizer, patch_fn=None):
    """``(workload, optimizer)``: ``build(name, seed=seed, **build_kwargs)`` with ``state["model"]`` loaded strictly
    (train mode), ``patch_fn(workload)`` applied, then ``make_optimizer(workload)`` with ``state["optimizer"]``
    loaded (patches keep parameter identity, so the optimizer state loads either way)."""
    from . import build

    workload = build(name, seed=seed, **build_kwargs)
    workload.model.load_state_dict(state["model"], strict=True)
    workload.model.train()
    if patch_fn is not None:
        patch_fn(workload)
    opt = make_optimizer(workload)
    opt.load_state_dict(state["optimizer"])
    return workload, opt


def summary(record: dict, path: Path, *more: str) -> str:
    """What ``python -m ampsafe_lab.workloads.<brink>`` prints: the cache file, the crossing, ``more``, the stop."""
    return "\n".join(
        [
            f"cache: {path}",
            f"crossed 65504 at step {record['crossed_step']} in {record['first_layer']}: "
            f"{record['over_fp16_at_crossing']}",
            *more,
            f"stopped after {record['steps_trained']} steps; probe over 65504: {record['over_fp16_probe']}",
        ]
    )
