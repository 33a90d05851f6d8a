"""HF generation under ``ampsafe run``: a float16 overflow in ``GenerationMixin.generate`` of the trained model heals.

Why here: RL trainers (TRL's ``GRPOTrainer``) sample completions with the model they train, under the same
autocast, before the optimizer step. A module whose float16 output passes 65504 there makes the logits NaN and
``torch.multinomial`` raises (``probability tensor contains either inf, nan or element < 0``) before any scaler
sees a gradient, so the floor heal never comes.

What it does, on the failure path only (a healthy ``generate`` runs as it is, nothing checked): that one error
from a model a healing scaler of the run trains (its resolved model, or before the first step any model with
trainable parameters) runs the generation again with a hook on every submodule (model state and random state put
back), islands the first module whose output holds an inf/NaN (the FP32 island a floor heal makes,
``ampsafe.patch(policy="island")``), and again until the generation samples; records the heal on that scaler
(``report.json``: cause "generation overflow", the step is the scaler's optimizer steps so far, the scale is
kept) and generates once more. An island computes in float32, so a module found again once islanded is no float16
overflow: then the islands made are undone. What is not healed is the original error with a note saying what was
measured (no scaler trains the model, a non-finite value an FP32 island keeps, a retry that still fails).

Why the generation's own run and not the floor heal's scan of the prompt: the overflow can come at a later token
than the prompt's (Qwen3 at ``tests/trl``'s edge: layer 0's ``down_proj`` on the prompt, layer 1's on a sampled
token), and the scan islands every path within its margin of 65504 (13 modules there, ``lm_head`` and the norms
among them) where two modules overflow.

Distributed: nothing collective. Each rank heals what its own generation shows; islands keep the parameters, so
DDP's gradient reduction is unchanged, and replicas whose generations overflow alike island alike.
"""

from __future__ import annotations

import functools
import logging
from typing import Optional

__all__ = ["SAMPLING_ERROR", "install_generate_heal"]

log = logging.getLogger("ampsafe.heal")

SAMPLING_ERROR = "probability tensor contains either"  # torch.multinomial on NaN/inf/negative probabilities
MAX_GENERATION_HEALS = 8  # heals of generations per process; then the error stands, noted
MAX_ISLANDS = 16  # modules one heal islands (one per run of the generation: a model's layers can all overflow)


def install_generate_heal(session, module) -> None:
    """Wrap ``module.GenerationMixin.generate`` (``transformers.generation.utils``) in the run's ledger."""
    cls = getattr(module, "GenerationMixin", None)
    if cls is None or not hasattr(cls, "generate"):
        return
    original = cls.generate
    heals: list = []

    @functools.wraps(original)
    def generate(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        except RuntimeError as exc:
            if SAMPLING_ERROR not in str(exc):
                raise
            failed = exc
            islanded = _heal(session, lambda: original(self, *args, **kwargs), self, failed, heals)
        try:
            return original(self, *args, **kwargs)
        except RuntimeError as again:
            if SAMPLING_ERROR not in str(again):
                raise
            failed.add_note(
                f"ampsafe run: islanded {', '.join(islanded)} after this error and generated again: the retry "
                "sampled non-finite probabilities too (run with --watch to name the op)"
            )
            raise failed from None

    session.set_attr(cls, "generate", generate)


def _heal(session, again, model, exc: RuntimeError, heals: list) -> tuple[str, ...]:
    """Island what overflows in the failed generation (``again()`` runs it once more) and record the heal on the
    scaler that trains ``model``; the islanded paths. On anything it cannot heal, ``exc`` is raised with a note
    saying why, and the model is left as it was."""
    from ..core.scale import HealPlan, HealRecord
    from ..core.sentinel import OVERFLOW
    from ..core.verdict import HealVerdict

    def refuse(why: str):
        exc.add_note(f"ampsafe run: the float16 generation of {type(model).__name__} was not healed: {why}")
        return exc

    scaler = _trained_by(session, model)
    if scaler is None:
        raise refuse("no healing scaler of this run trains this model")
    if len(heals) >= MAX_GENERATION_HEALS:
        raise refuse(f"it was healed {len(heals)} times already ({', '.join(p for h in heals for p in h)})")
    step = int(scaler.stats.total_steps)
    try:
        found, islanded = _island_overflows(scaler._backend(), model, again)
    except _NotHealed as why:
        raise refuse(str(why)) from None
    # each module's output went non-finite in float16 and stopped doing so in float32: a float16 overflow
    verdict = HealVerdict("generation", module=found[0], kind=OVERFLOW)
    record = HealRecord(step=step, paths=islanded, found=found, verdict=verdict)
    # the scale stays where it is (no step overflowed); before the first step the scaler's tensor is not built yet
    plan = HealPlan(islanded, float(scaler.get_scale()), record)
    if getattr(scaler, "_scale", None) is not None:
        scaler.apply_heal(step, plan)
    else:
        scaler._core.heal(step, plan)
    heals.append(islanded)
    log.warning(
        "ampsafe heal at step %s: %s.generate sampled from non-finite probabilities: the float16 output of %s "
        "overflowed in the generation's forward (finite as an FP32 island); islanded %s and generating again",
        step,
        type(model).__name__,
        ", ".join(found),
        ", ".join(islanded),
    )
    return islanded


class _NotHealed(Exception):
    """Why replaying the generation heals nothing (the islands it tried are undone)."""


def _island_overflows(backend, model, again) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Run the generation again with a hook on every submodule, island the first module whose output holds an
    inf/NaN, and again until the generation samples (``MAX_ISLANDS`` modules at most): (the modules
    found, the islands made). An island computes in float32, so a module found again once islanded is no float16
    overflow: :class:`_NotHealed`, as for any run that does not end sampling; the islands made here are undone
    then. The model's state and the random state are put back after each run."""
    from ..core.swaps import protection_of, unswap
    from ..healing.fronts import fronts

    modules = backend.modules(model)
    found: list[str] = []
    islanded: list[str] = []
    try:
        while True:
            first = _first_nonfinite(backend, model, modules, again)
            if first is None:
                if not found:
                    raise _NotHealed("run again, the generation sampled and no module's output was non-finite")
                return tuple(found), tuple(islanded)
            if first == _SAMPLED:
                return tuple(found), tuple(islanded)
            if first == "":
                raise _NotHealed("no submodule's output is non-finite: the model's own forward made the value")
            if protection_of(modules[first]) == "island":
                raise _NotHealed(
                    f"the output of {first} stays non-finite as an FP32 island (islanded: {', '.join(islanded)}): "
                    "not a float16 overflow; run with --watch to name the op"
                )
            if len(found) == MAX_ISLANDS:
                raise _NotHealed(f"the output of {first} is non-finite after islanding {', '.join(islanded)}")
            found.append(first)
            result = fronts().patch(model, policy="island", paths=[first])
            islanded += [p for p in result.patched if p not in islanded] or [first]
    except BaseException:
        for path in islanded:
            unswap(modules[path])
        raise


_SAMPLED = "<sampled>"  # the generation sampled, some module's output non-finite on the way


def _first_nonfinite(backend, model, modules: dict, again) -> Optional[str]:
    """One more run of the generation with a hook on every submodule: the path of the first module whose output
    holds an inf/NaN when it raised the sampling error (``""``: none, the root's own), else None (it sampled with
    every output finite) or :data:`_SAMPLED`."""
    from ..core.model import first_nonfinite_output

    try:
        with first_nonfinite_output(backend, modules) as first, backend.replay(model):
            again()
    except RuntimeError as exc:
        if SAMPLING_ERROR not in str(exc):
            raise _NotHealed(f"run again, the generation raised {type(exc).__name__}: {exc}") from None
        return first[0] if first else ""
    return _SAMPLED if first else None


def _trained_by(session, model) -> Optional[object]:
    """The run's healing scaler that trains ``model``: its resolved model, or (before its first step) any scaling
    scaler when ``model`` has trainable parameters (the policy an RL trainer samples from)."""
    from ..core.amp import OnFloor
    from ..core.model import unwrap

    model = unwrap(model)
    candidates = []
    for tracked in session.scalers:
        scaler = tracked.scaler
        if getattr(scaler, "disabled_reason", None) is not None or not hasattr(scaler, "apply_heal"):
            continue
        policy = getattr(scaler, "policy", None)
        if getattr(policy, "on_floor", None) is not OnFloor.HEAL:
            continue
        resolved = getattr(scaler, "model", None)
        if resolved is model:
            return scaler
        if resolved is None:
            candidates.append(scaler)
    trainable = any(p.requires_grad for p in model.parameters())
    return candidates[-1] if candidates and trainable else None
