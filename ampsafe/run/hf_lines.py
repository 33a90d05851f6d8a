"""The backoff scan's fix lines for an HF transformers model, each tried on the model before the report prints it.

Why: a line the report prints is one the user pastes, so it is applied to the user's own model first, on the batch
that overflowed, and printed only when it removes the overflow; otherwise the report says what the trial measured.

* the island line ``ampsafe.patch(model, policy="island", paths=[...])``: patched in place, the step's batch
  replayed under the step's autocast, the patch undone (the same modules, parameters and state as before);
* HF's ``_keep_in_fp32_modules``: the model's own list plus the modules whose own output passes 65504 in float32
  (not already matched by the list). HF applies the list when ``from_pretrained(..., dtype=torch.float16)`` casts
  the weights, so the trial does what that load does, in place: every floating parameter and buffer float16
  except those the model's ``_get_dtype_plan`` keeps float32 (names searched with the list's entries, as HF
  does), one forward without autocast, then the original tensors put back. It works only where the model's code
  casts a layer's input to the layer's weight dtype (T5's ``wo``); elsewhere (GPT-2's ``Conv1D``) the forward
  raises, and that measured error is the report's reason for giving no keep line.

"Removes the overflow": without the line some module's output (or the model's output) holds an inf/NaN, with it
none does. Every trial runs without gradients, with the model's buffers and the random generators put back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..core.backend import FLOAT32
from ..core.graph import FP16_MAX
from ..core.model import call, first_nonfinite, unwrap

__all__ = ["HfLines", "hf_lines", "float16_overflow", "keep_candidates"]


@dataclass(frozen=True)
class HfLines:
    """What the trials found: ``island`` says how the island line was tried (and ``island_works``); ``keep`` is
    the ``_keep_in_fp32_modules`` line when its trial removed the overflow, ``keep_note`` the trial's evidence or
    the reason for no line."""

    island: str = ""
    island_works: bool | None = None
    keep: str | None = None
    keep_note: str = ""


def _overflow(backend, model, inputs, context) -> str | None:
    """The first module whose output (or ``<output>``: the model's) holds an inf/NaN in one forward of ``inputs``
    under ``context()``, or None; ``"raises <error>"`` when the forward raises."""

    def forward():
        with context():
            return call(model, inputs)

    try:
        first, output_finite = first_nonfinite(backend, model, forward)
    except Exception as exc:  # noqa: BLE001 - a line whose forward raises is measured, not a crash of the run
        return f"raises {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return first or (None if output_finite else "<output>")


def _try_island(backend, model, inputs, state, modules, step) -> HfLines:
    from ..core.swaps import unswap
    from ..patching import patch

    replay = lambda: backend.amp.replay(state)  # noqa: E731
    before = _overflow(backend, model, inputs, replay)
    done = patch(model, policy="island", paths=list(modules))
    try:
        after = _overflow(backend, model, inputs, replay)
    finally:
        patched = backend.modules(unwrap(model))
        for path in done.patched:
            unswap(patched[path])
    works = before is not None and after is None
    text = (
        f"tried on the model: the batch of step {step}, replayed under the step's autocast, overflows at "
        f"`{before}` without it and nowhere with it"
        if works
        else f"tried on the model, it did not remove the overflow (without it: {before or 'none'}; with it: "
        f"{after or 'none'})"
    )
    return HfLines(island=text, island_works=works)


def _matcher(model, entries: list[str]):
    """The names ``from_pretrained(..., dtype=torch.float16)`` keeps float32 with ``_keep_in_fp32_modules =
    entries``: the model's own ``_get_dtype_plan`` (the strict list too), its keys searched as HF does."""
    import torch

    had = "_keep_in_fp32_modules" in vars(model)
    old = vars(model).get("_keep_in_fp32_modules")
    model._keep_in_fp32_modules = list(entries) or None
    try:
        plan = model._get_dtype_plan(torch.float16)
    finally:
        if had:
            model._keep_in_fp32_modules = old
        else:
            del model._keep_in_fp32_modules
    pattern = re.compile("|".join(f"(?:{k.replace('*', '.*')})" for k in plan)) if plan else None
    return lambda name: pattern is not None and pattern.search(name) is not None


def float16_overflow(backend, model, inputs, entries: list[str]) -> str | None:
    """:func:`_overflow` of the model as ``from_pretrained(..., dtype=torch.float16)`` with ``entries`` loads it."""
    import torch

    kept = _matcher(model, entries)
    swapped = []
    with torch.no_grad():
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if t.is_floating_point() and t.dtype != torch.float16 and not kept(name):
                swapped.append((t, t.data))
                t.data = t.data.to(torch.float16)
    try:
        half = _half_inputs(inputs)
        return _overflow(backend, model, half, backend.amp.float32)  # autocast off: the model's own dtypes
    finally:
        for t, data in swapped:
            t.data = data


def _half_inputs(obj):
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(torch.float16) if obj.is_floating_point() else obj
    if isinstance(obj, dict):
        return {k: _half_inputs(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_half_inputs(v) for v in obj)
    return obj


def keep_candidates(backend, model, inputs, paths) -> list[str]:
    """Of ``paths``, in their order, the modules that hold parameters of their own and whose own float32 output
    passes 65504 (NaN counts as past it) in one replay of ``inputs``."""
    modules = backend.modules(model)
    owners = {p: modules[p] for p in paths if p in modules and any(True for _ in modules[p].parameters(False))}
    amax = output_amax(backend, model, owners, inputs) if owners else {}
    return [p for p in owners if not amax.get(p, 0.0) <= FP16_MAX]


def _try_keep(backend, model, inputs, paths, step) -> HfLines:
    import json

    own = sorted(getattr(model, "_keep_in_fp32_modules", None) or ())  # HF 5 merges the parts' lists into a set
    names = keep_candidates(backend, model, inputs, paths)
    if not names:
        return HfLines(keep_note="no module with weights of its own passes 65504 in float32: no keep line")
    covered = _matcher(model, own)
    new = [n for n in names if not any(covered(f"{n}.{p}") for p, _ in model.get_submodule(n).named_parameters())]
    entries = own + new
    line = f"model._keep_in_fp32_modules = {json.dumps(entries)}"
    before = float16_overflow(backend, model, inputs, [])
    after = float16_overflow(backend, model, inputs, entries)
    loaded = "the model as `from_pretrained(..., dtype=torch.float16)` loads it"
    if before is not None and after is None:
        own_note = f" (the model's own list {json.dumps(own)} already covers them)" if own and not new else ""
        note = (
            f"tried on the model: {loaded} overflows at `{before}` on the batch of step {step} with no module "
            f"kept in float32, and nowhere with this list{own_note}"
        )
        return HfLines(keep=line, keep_note=note)
    if after is None:
        reason = f"{loaded} does not overflow on the batch of step {step} even without it: the list changes nothing"
    elif after.startswith("raises"):
        cast = " (a float16 input meets a float32 weight in a layer that does not cast it)" if "dtype" in after else ""
        reason = f"{loaded} with it {after}{cast}"
    else:
        reason = f"{loaded} with it still overflows at `{after}`"
    note = f"`{line}` was tried on the model: {reason}"
    return HfLines(keep_note=note + "; no `_keep_in_fp32_modules` line, the island line is the fix")


def hf_lines(backend, model, inputs, state, modules, paths, step) -> HfLines:
    """The island trial of ``modules`` (under the step's autocast ``state``) and the keep-list trial of the risky
    ``paths``' modules, on ``model`` (an HF model, see :func:`ampsafe.run.hf.is_hf_model`) and ``inputs``."""
    model = unwrap(model)
    island = _try_island(backend, model, inputs, state, modules, step)
    keep = _try_keep(backend, model, inputs, paths, step)
    return HfLines(island=island.island, island_works=island.island_works, keep=keep.keep, keep_note=keep.keep_note)


def output_amax(backend, model, modules: dict, inputs) -> dict[str, float]:
    """path -> the largest |output| of that module in one float32 replay of ``inputs`` (model state put back)."""
    amax: dict[str, float] = {}

    def hook(path):
        def record(module, args, output):
            if getattr(output, "is_floating_point", lambda: False)() and output.numel():
                amax[path] = max(amax.get(path, 0.0), float(output.detach().abs().max()))

        return record

    handles = [module.register_forward_hook(hook(path)) for path, module in modules.items()]
    try:
        with backend.replay(model, FLOAT32):
            call(model, inputs)
    finally:
        for handle in handles:
            handle.remove()
    return amax
