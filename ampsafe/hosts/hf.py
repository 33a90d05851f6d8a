"""HF transformers: ``Trainer``'s ``amp/*`` callback, adding it under ``ampsafe run``, and the fix lines said in
HF's own words (``_keep_in_fp32_modules``), each tried on the user's model before the report prints it.

**The callback.** Example::

    from ampsafe.integrations.hf import AmpCallback
    trainer = Trainer(model, args, callbacks=[AmpCallback()])   # TrainingArguments(fp16=True, report_to=...)

Why it moves itself: ``Trainer`` puts the callbacks a user passes *after* its own reporting callbacks
(``TensorBoardCallback``, ``WandbCallback``, ...), and they write ``logs`` in their ``on_log`` as they get it,
so keys a user callback adds in its ``on_log`` reach no logger. HF hands a callback neither its trainer nor
its ``CallbackHandler``; but the handler is the caller of ``on_init_end`` (and ``on_train_begin``), so there
the callback finds the handler's list holding it and moves itself just ahead of the first reporting callback.
The console line (``ProgressCallback``) stays as it was. Where that lookup finds nothing (another
``transformers`` than the one this was read against), a warning says so and :func:`add_callback` places it.
HF's logging callbacks prefix training keys with ``train/``: TensorBoard shows ``train/amp/loss_scale``. The
scaler is the one the Trainer steps with: accelerate's, reached through the optimizer the callback is handed
(``AcceleratedOptimizer.scaler``), or the ``scaler`` given to the callback. A run without loss scaling logs
nothing. ``trainer.state.log_history`` gets the keys too. Under ``ampsafe run`` the callback is added once the
``Trainer`` is built, unless the script added one. ``--emulate-fp16`` for ``Trainer(fp16=True)`` is accelerate's
(:mod:`ampsafe.hosts.accelerate`): the Trainer builds its ``Accelerator`` from its arguments.

**Generation.** Under ``ampsafe run``, ``GenerationMixin.generate`` of a model the run's scaler trains heals a
float16 overflow that makes it sample from NaN probabilities (TRL's ``GRPOTrainer`` generates before its first
step): :mod:`ampsafe.hosts._generation`.

**The fix lines.** A line the report prints is one the user pastes, so it is applied to the user's own model
first, on the batch that overflowed, and printed only when it removes the overflow ("removes": without the line
some module's output, or the model's, holds an inf/NaN; with it none does); otherwise the report says what the
trial measured. Every trial runs without gradients, with the model's buffers and the random generators put back.

* the island line ``ampsafe.patch(model, policy="island", paths=[...])``: patched in place, the step's batch
  replayed under the step's autocast, the patch undone (the same modules, parameters and state as before);
* HF's ``_keep_in_fp32_modules``: HF models list the modules that stay float32 when the rest is cast to float16
  (T5's ``["wo"]``, found by hand after the float16 overflows of HF issue #5651); ``from_pretrained(...,
  dtype=torch.float16)`` reads that list (``model._get_dtype_plan``) and searches each parameter name for its
  entries. The line is the model's own list plus the modules whose own output passes 65504 in float32 (not
  already matched by the list), so the fix survives without ampsafe. Its trial does what that load does, in
  place: every floating parameter and buffer float16 except those the plan keeps float32, one forward without
  autocast, then the original tensors put back. It works only where the model's code casts a layer's input to
  the layer's weight dtype (T5's ``wo``); elsewhere (GPT-2's ``Conv1D``) the forward raises, and that measured
  error is the report's reason for giving no keep line.

Only modules that hold parameters themselves and went past 65504 are named: HF's list acts on parameters, and
a float32 weight also means a float32 output fed to the next layer; HF's list is a per-model contract, and this
names the modules that overflowed, not that contract. Which ones did is measured, not read off the heal's paths
(a path's range includes the ops after its start): forward hooks (``backend.forward_hook``) on the candidates
during one float32 replay of the healer's last batch, right after the heal's step (:func:`follow`, a step
callback; the scaler forgets the batch when its step ends). An HF model is one with ``_keep_in_fp32_modules``
and ``_get_dtype_plan`` (duck-typed: importing this module imports neither torch nor transformers).
"""

from __future__ import annotations

import functools
import re
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

from ..core.backend import FLOAT32
from ..core.graph import FP16_MAX
from ..core.model import call, first_nonfinite, unwrap
from ..integrations.metrics import amp_metrics
from . import Host
from ._generation import install_generate_heal
from ._install import after_init

__all__ = [  # noqa: F822 - AmpCallback is built on first use (__getattr__)
    "AmpCallback",
    "add_callback",
    "is_hf_model",
    "keep_in_fp32",
    "follow",
    "HfLines",
    "hf_lines",
    "float16_overflow",
    "keep_candidates",
    "output_amax",
    "HOST",
]


# -- the callback in Trainer's logs
def __getattr__(name: str):
    if name == "AmpCallback":
        return _callback_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def add_callback(trainer: Any, scaler: Any = None):
    """Add an :class:`AmpCallback` to a built ``trainer``, ahead of its reporting callbacks; returns it."""
    callback = _callback_class()(scaler=scaler)
    _go_ahead(trainer.callback_handler.callbacks, callback, append=True)
    return callback


def _reporting_classes() -> tuple[type, ...]:
    """The callback classes ``report_to`` adds (``TensorBoardCallback``, ``WandbCallback``, ...)."""
    from transformers.integrations import integration_utils

    return tuple(set(integration_utils.INTEGRATION_TO_CALLBACK.values()))


def _go_ahead(callbacks: list, callback: Any, append: bool = False) -> None:
    """Move ``callback`` in ``callbacks`` just ahead of the first reporting callback (or leave it where it is
    when none comes before it; ``append``: add it first). Only entries ahead of its old place shift, so a
    ``call_event`` looping over ``callbacks`` while this runs calls every callback once."""
    reporting = _reporting_classes()
    first = next((i for i, cb in enumerate(callbacks) if isinstance(cb, reporting)), None)
    mine = next((i for i, cb in enumerate(callbacks) if cb is callback), None)
    if mine is None:
        callbacks.insert(len(callbacks) if first is None else first, callback)
    elif first is not None and first < mine:
        del callbacks[mine]
        callbacks.insert(first, callback)


def _callbacks_calling(callback: Any, frame) -> Optional[list]:
    """The callback list of the ``CallbackHandler`` whose ``call_event`` is running ``callback``'s event: the
    ``self`` of a calling frame whose ``callbacks`` list holds this very callback."""
    for _ in range(4):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        callbacks = getattr(owner, "callbacks", None)
        if isinstance(callbacks, list) and any(cb is callback for cb in callbacks):
            return callbacks
        frame = frame.f_back
    return None


@functools.cache
def _callback_class() -> type:
    from transformers import TrainerCallback

    class AmpCallback(TrainerCallback):
        """Adds ``amp/loss_scale``, ``amp/overflow_steps``, ``amp/skipped_steps``, ``amp/heals`` and
        ``amp/floor_hits`` (:mod:`ampsafe.integrations.metrics`) to every ``logs`` of the ``Trainer``, ahead of
        its reporting callbacks. ``scaler``: the scaler to read (default: the Trainer's, through accelerate)."""

        def __init__(self, scaler: Any = None) -> None:
            self.scaler = scaler
            self._placed = False

        def on_init_end(self, args, state, control, **kwargs):
            self._place(sys._getframe(1))

        def on_train_begin(self, args, state, control, **kwargs):
            self._place(sys._getframe(1))

        def on_log(self, args, state, control, logs=None, optimizer=None, **kwargs):
            scaler = self.scaler if self.scaler is not None else getattr(optimizer, "scaler", None)
            metrics = amp_metrics(scaler)
            if logs is None or not metrics:
                return
            mirrored = _history_entry(state, logs)
            logs.update(metrics)
            if mirrored is not None:
                mirrored.update(metrics)

        def _place(self, frame) -> None:
            if self._placed:
                return
            callbacks = _callbacks_calling(self, frame)
            self._placed = True
            if callbacks is None:
                warnings.warn(
                    "ampsafe AmpCallback could not find the Trainer's callback list to go ahead of its reporting "
                    "callbacks: the amp/* keys may not reach TensorBoard or W&B. Add it with "
                    "ampsafe.integrations.hf.add_callback(trainer) instead.",
                    stacklevel=2,
                )
                return
            _go_ahead(callbacks, self)

    AmpCallback.__module__ = __name__
    AmpCallback.__qualname__ = "AmpCallback"
    return AmpCallback


def _history_entry(state: Any, logs: dict) -> Optional[dict]:
    """The ``state.log_history`` entry ``Trainer.log`` made from ``logs`` just before ``on_log`` (a copy plus
    ``step``), so the history keeps what the loggers get; None when the last entry is not that copy."""
    history = getattr(state, "log_history", None)
    if not history or not isinstance(history[-1], dict):
        return None
    last = history[-1]
    # a shallow copy holds the very value objects (a NaN loss is not == itself)
    same = last.get("step") == state.global_step and all(last.get(k) is v or last.get(k) == v for k, v in logs.items())
    return last if same else None


# -- under ampsafe run: the callback added once the Trainer is built
def _add_to_trainer(session, module) -> None:
    def add(trainer):
        kind = _callback_class()
        if any(isinstance(cb, kind) for cb in trainer.callback_handler.callbacks):
            return None
        add_callback(trainer)
        return "AmpCallback, ahead of the report_to callbacks"

    after_init(session, module.Trainer, add, "HF Trainer")


# -- the keep list, measured on each heal
_MEMO = "_ampsafe_hf_keep_in_fp32"  # on the scaler: its _Measured


@dataclass
class _Measured:
    """What was measured of one scaler's heals so far: how many heals, and the modules found past float16."""

    done: int = 0
    names: list[str] = field(default_factory=list)
    note: str = ""  # why a list the heals gave was not kept (its trial failed)


def is_hf_model(model) -> bool:
    """True for an HF transformers ``PreTrainedModel`` (it has the dtype-plan attributes ``from_pretrained`` reads)."""
    return model is not None and hasattr(model, "_keep_in_fp32_modules") and hasattr(model, "_get_dtype_plan")


def _healer(scaler):
    return getattr(scaler, "heal_hook", None) or getattr(scaler, "_healer", None)


def _measure(scaler) -> None:
    """Measure the heals ``scaler`` made since the last call, on the healer's last batch, into its memo."""
    healer = _healer(scaler)
    heals = getattr(healer, "heals", None) or []
    memo = scaler.__dict__.setdefault(_MEMO, _Measured())
    model = getattr(healer, "model", None)
    if len(heals) <= memo.done or not is_hf_model(model):
        return
    inputs = healer.last_inputs
    if inputs is None:
        return  # the step's batch is gone: the next step's callback measures on its batch
    paths = [p for record in heals[memo.done :] for p in (*record.found, *record.paths) if p]
    candidates = keep_candidates(healer.backend, model, inputs, list(dict.fromkeys(paths)))
    new = [p for p in candidates if p not in memo.names]
    memo.done = len(heals)
    if new:
        failed = _float16_trial(healer.backend, model, inputs, memo.names + new)
        if failed is None:
            memo.names += new
        else:
            memo.note = failed


def _float16_trial(backend, model, inputs, names: list[str]) -> str | None:
    """Try the list as HF applies it, on an unpatched copy of the healed model (its islands would cast what the
    model's own code does not): None when ``from_pretrained(..., dtype=torch.float16)`` with the model's own list
    plus ``names`` runs the heal's batch with no overflow, else what the trial measured."""
    import copy

    from ..patching import unpatch

    try:
        bare = copy.deepcopy(unwrap(model))
        unpatch(bare)
    except Exception as exc:  # noqa: BLE001 - a line that cannot be tried is not printed
        return f"the model could not be copied to try the list ({type(exc).__name__})"
    own = sorted(getattr(bare, "_keep_in_fp32_modules", None) or ())
    after = float16_overflow(backend, bare, inputs, own + [n for n in names if n not in own])
    if after is None:
        return None
    return f"with the list the float16 model {after}" if after.startswith("raises") else f"still overflows at `{after}`"


def follow(scaler):
    """A step callback for ``scaler.add_step_callback``: after each update, while the step's batch is still
    the healer's last one, measure any new heal (see :func:`keep_in_fp32`)."""

    def measure(decision) -> None:
        try:
            _measure(scaler)
        except Exception:  # noqa: BLE001 - a report's extra line never stops training
            pass

    return measure


def keep_in_fp32(scaler) -> list[str] | None:
    """The ``_keep_in_fp32_modules`` entries for ``scaler``'s heals, or None when its healer's model is not HF's.

    Each entry is a module path relative to the healed model (HF searches parameter names for it): of the modules
    the heals started a path at or islanded, those that hold parameters of their own and whose own output passes
    65504 when the heal's batch (or the next step's, under :func:`follow`) is replayed in float32, kept only when
    the list, tried as ``from_pretrained(..., dtype=torch.float16)`` applies it on an unpatched copy of the model,
    runs that batch with no overflow (GPT-2's ``Conv1D`` does not cast its float16 input to a float32 weight: no
    list works there). A heal also
    islands what lies downstream of the overflow and what comes within its margin of the edge: those are the patch
    line's, not this list's. In heal order, each once.
    """
    healer = _healer(scaler)
    if not is_hf_model(getattr(healer, "model", None)) or not getattr(healer, "heals", None):
        return None
    _measure(scaler)  # heals not measured yet, if the batch is still there
    return list(scaler.__dict__.get(_MEMO, _Measured()).names)


# -- the backoff scan's lines, tried on the model
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
    ``paths``' modules, on ``model`` (an HF model, see :func:`is_hf_model`) and ``inputs``."""
    model = unwrap(model)
    island = _try_island(backend, model, inputs, state, modules, step)
    keep = _try_keep(backend, model, inputs, paths, step)
    return HfLines(island=island.island, island_works=island.island_works, keep=keep.keep, keep_note=keep.keep_note)


def output_amax(backend, model, modules: dict, inputs) -> dict[str, float]:
    """path -> the largest |output| of that module in one float32 replay of ``inputs`` (model state put back)."""
    amax: dict[str, float] = {}
    tensors = backend.tensors

    def hook(path):
        def record(output):
            if isinstance(output, tensors.tensor_type) and tensors.is_float(output) and tensors.numel(output):
                amax[path] = max(amax.get(path, 0.0), float(tensors.abs_max(output)))

        return record

    handles = [backend.forward_hook(module, hook(path)) for path, module in modules.items()]
    try:
        with backend.replay(model, FLOAT32):
            call(model, inputs)
    finally:
        for handle in handles:
            handle.remove()
    return amax


HOST = Host(
    "hf",
    registers={"transformers.generation.utils": install_generate_heal},
    loggers={"transformers.trainer": _add_to_trainer},
)
