"""A heal said in HF transformers' own words: the ``_keep_in_fp32_modules`` entries of the modules that overflowed.

HF models list the modules that stay float32 when the rest is cast to float16 (T5's ``["wo"]``, found by hand
after the float16 overflows of HF issue #5651); ``from_pretrained(..., dtype=torch.float16)`` reads that list
(``model._get_dtype_plan``) and searches each parameter name for its entries. When ampsafe heals an HF model,
:func:`keep_in_fp32` names the modules whose own weights produced the overflowing values, so the report can give
that line beside ``ampsafe.patch(..., paths=[...])`` and the fix survives without ampsafe.

Only modules that hold parameters themselves and went past 65504 are named: HF's list acts on parameters, and
a float32 weight also means a float32 output fed to the next layer. HF's T5 casts ``wo``'s input to ``wo``'s
dtype; a layer whose code does not cast breaks the pure float16 forward when listed, so HF's list is a
per-model contract, and this names the modules that overflowed, not that contract. Which ones did is measured,
not read off the heal's paths (a path's range includes the ops after its start): forward hooks on the candidates
during one float32 replay of the healer's last batch, right after the heal's step (:func:`follow`, a step callback;
the scaler forgets the batch when its step ends). Duck-typed (no framework
import): an HF model is one with ``_keep_in_fp32_modules`` and ``_get_dtype_plan``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .hf_lines import float16_overflow, keep_candidates

__all__ = ["is_hf_model", "keep_in_fp32", "follow"]

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

    from ..core.model import unwrap
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
