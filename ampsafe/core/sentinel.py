"""Framework-neutral logic of ``ampsafe.watch``: the origin's verdict, its message, and the headroom monitor.

Adapters (``ampsafe.torch.watch``, ``ampsafe.paddle.watch``) see the ops and tensors; they hand this module
plain numbers (numpy arrays, abs-maxes, flags) and get back the :class:`~ampsafe.NonFiniteError` to raise or
record, and the headroom warnings to emit. Like fairseq's ``NanDetector``, it reports the *origin* (the first
op whose inputs were finite and whose outputs were not), not the flood of ops the NaN ran through after it.
The watch object both adapters subclass is :class:`ampsafe.core.watcher.WatchBase`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from ..errors import NonFiniteError
from .graph import FP16_MAX, headroom_bits

__all__ = [
    "OVERFLOW",
    "NUMERICAL",
    "INPUT",
    "PARAMETER",
    "UNKNOWN",
    "MOVEMENT_OPS",
    "verdict",
    "tensor_stats",
    "first_nonfinite_row",
    "BadInput",
    "nonfinite_input",
    "nonfinite_error",
    "rerun_failure",
    "HeadroomWarning",
    "headroom_warnings",
]

log = logging.getLogger("ampsafe.watch")

OVERFLOW, NUMERICAL, INPUT = "overflow", "numerical", "input"
PARAMETER = "parameter"  # a weight or buffer was already non-finite (a previous step's update went bad)
UNKNOWN = "unknown"  # not measured: the guard had nothing to replay, or the op's float32 re-run failed
LOW_PRECISION_DTYPES = ("float16", "bfloat16")

# Ops that only move or re-view data: when their input was already non-finite they are not the origin;
# the first op that computes with the bad data is reported instead (e.g. the box resize, not the unbind).
MOVEMENT_OPS = frozenset(
    """getitem slice select unbind split chunk view reshape flatten squeeze unsqueeze permute transpose
    expand contiguous clone detach to cast copy stack concat cat index_select gather narrow t float half
    bfloat16 double type_as new_tensor as_strided unflatten movedim""".split()
)


def verdict(
    low_precision: bool, inputs_finite: bool, rerun_finite: bool | None, *, from_param=False, rerun_failed=False
) -> str:
    """The kind of a non-finite origin.

    ``inputs_finite``: the op's inputs were all finite; otherwise the bad value came from outside any op
    (the data, or a parameter when ``from_param``). ``rerun_finite``: the op re-run in float32 on the same
    (upcast) inputs gave finite outputs (None: not re-run, the op already ran in float32). ``rerun_failed``:
    the float32 re-run raised, so float32 was never checked and the kind is :data:`UNKNOWN`.
    """
    if not inputs_finite:
        return PARAMETER if from_param else INPUT
    if low_precision and rerun_failed:
        return UNKNOWN
    if low_precision and rerun_finite:
        return OVERFLOW
    return NUMERICAL


def tensor_stats(array) -> dict:
    """abs-max / abs-min over the finite values, and NaN / Inf counts, of one tensor (as numpy)."""
    a = np.asarray(array, dtype=np.float64)
    finite = np.isfinite(a)
    vals = np.abs(a[finite])
    return {
        "shape": tuple(a.shape),
        "absmax": float(vals.max()) if vals.size else None,
        "absmin": float(vals.min()) if vals.size else None,
        "nan": int(np.isnan(a).sum()),
        "inf": int(np.isinf(a).sum()),
    }


def first_nonfinite_row(array, batch_size: int | None) -> int | None:
    """Index along dim 0 of the first non-finite element, when dim 0 is the batch (its size is ``batch_size``)."""
    a = np.asarray(array)
    if a.ndim == 0 or batch_size is None or a.shape[0] != batch_size:
        return None
    bad = ~np.isfinite(a.reshape(a.shape[0], -1)).all(axis=1)
    hits = np.flatnonzero(bad)
    return int(hits[0]) if hits.size else None


@dataclass(frozen=True)
class BadInput:
    """A model input that holds a NaN/Inf: ``where`` (``args[0][1]``, ``batch['img'][1]``, as the sentinel names
    inputs) and ``sample``, its index in the batch (None when the input has no batch dimension)."""

    where: str
    sample: int | None = None

    @property
    def text(self) -> str:
        return self.where + (f" (sample {self.sample})" if self.sample is not None else "")


def nonfinite_input(latest, tensors) -> BadInput | None:
    """The first floating input of a forward's ``(args, kwargs)`` that holds a NaN/Inf, or None.

    ``tensors``: the framework's :class:`~ampsafe.core.backend.Tensors`. One ``finite`` check per floating
    tensor (no copy); only a non-finite one is read back to find its sample (its first bad row along the batch
    dimension, or its index in a list of samples such as torchvision's list of images).
    """
    args, kwargs = latest
    named = [(f"args[{i}]", a) for i, a in enumerate(args)] + list((kwargs or {}).items())
    for where, value in named:
        bad = _nonfinite_in(where, value, None, tensors, 0)
        if bad is not None:
            return bad
    return None


def _nonfinite_in(where: str, value, sample, tensors, depth: int) -> BadInput | None:
    if isinstance(value, tensors.tensor_type):
        if not tensors.is_float(value) or tensors.finite(value):
            return None
        rows = int(value.shape[0]) if value.ndim and depth == 0 else None
        row = first_nonfinite_row(tensors.to_numpy(value), rows) if rows is not None else None
        return BadInput(where + (f"[{row}]" if row is not None else ""), sample if sample is not None else row)
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items if depth < 3 else ():
        # a list of samples (torchvision's images): its index is the sample; a dict of batched arrays (ppdet,
        # ultralytics) keeps the batch dimension of its values
        inner = key if sample is None and depth == 0 and not isinstance(value, dict) else sample
        bad = _nonfinite_in(f"{where}[{key!r}]", item, inner, tensors, depth + (0 if isinstance(value, dict) else 1))
        if bad is not None:
            return bad
    return None


_ADVICE = {
    OVERFLOW: (
        "it is finite when re-run in float32: a float16 overflow. Keep this path in float32 "
        "(ampsafe.patch(model, example_inputs) makes it an FP32 island or rescales it)"
    ),
    NUMERICAL: (
        "it is non-finite in float32 too: a numerical error (log of 0, division by 0, exp of a large value, "
        "sqrt of a negative); guard the op's input (clamp, eps) rather than the precision"
    ),
    INPUT: (
        "its input was already non-finite when it reached the model: the data or targets are bad "
        "(ampsafe.check_targets names bad boxes; drop or fix the sample)"
    ),
    PARAMETER: (
        "a weight or buffer it read was already non-finite: an earlier optimizer step went bad "
        "(watch the earlier steps, or restore a checkpoint)"
    ),
    UNKNOWN: "pass replay= to check() so the guard can re-run the batch with full hooks and name the op",
}

# NUMERICAL says "float32 too" only where float32 ran; these say what was measured instead
_NUMERICAL_BACKWARD = (
    "its gradient went non-finite although it ran in float32: a numerical error in the backward (a log, sqrt "
    "or division of a bad value); guard the op's input (clamp, eps)"
)
_NAN_LOW_BACKWARD = (
    "its low-precision gradient went non-finite, and not as a plain overflow (a NaN, or non-finite gradients "
    "came in); float32 was not tried on the backward, so overflow vs numerical error is not established: "
    "check the forward under ampsafe.watch first (a forward overflow poisons every gradient after it)"
)


def _advice(phase: str, kind: str, dtype: str, reason: str) -> str:
    """What the error can honestly say: ``reason`` (what was not measured, and why) wins."""
    if reason:
        return reason
    if phase == "backward" and kind == OVERFLOW:
        return _BACKWARD_OVERFLOW
    if phase == "backward" and kind == NUMERICAL:
        return _NAN_LOW_BACKWARD if dtype.startswith(LOW_PRECISION_DTYPES) else _NUMERICAL_BACKWARD
    return _ADVICE.get(kind, "")


def rerun_failure(exc: BaseException) -> str:
    """The reason of an :data:`UNKNOWN` verdict when an op's float32 re-run raised."""
    return (
        f"its float32 re-run failed ({type(exc).__name__}: {exc}), so whether float32 overflows too was not "
        "measured: neither overflow nor numerical error is established. Re-run the op in float32 by hand, or "
        "keep its path in float32 (ampsafe.patch) and see whether the non-finite value goes away"
    )


_BACKWARD_OVERFLOW = (
    "finite gradients came in and its low-precision gradient overflowed (inf): with a dynamic loss scale the "
    "step is skipped and the scale backs off; if it persists at a small scale, keep this op in float32 "
    "(ampsafe.patch) or use ampsafe's GradScaler with a floor"
)


def nonfinite_error(
    *,
    phase: str,
    module: str,
    op: str,
    kind: str,
    sample: int | None = None,
    stats: dict | None = None,
    dtype: str = "",
    where: str = "",
    step: int | None = None,
    reason: str = "",
) -> NonFiniteError:
    """Build the :class:`NonFiniteError` for an origin, with a message that says what to do.

    ``reason``: why the kind is what it is when the usual advice would claim something not measured (an
    :data:`UNKNOWN` verdict); it replaces the advice and is kept as ``stats["reason"]``.
    """
    stats = dict(stats or {})
    if reason:
        stats["reason"] = reason
    who = f"{module or '<root>'}:{op}"
    parts = [f"first non-finite value of the {phase} pass comes from {who}"]
    if dtype:
        parts.append(f"(ran in {dtype})")
    if step is not None:
        parts.append(f"at step {step}")
    if sample is not None:
        parts.append(f"in sample {sample}")
    if where:
        parts.append(f"[{where}]")
    msg = " ".join(parts) + f": kind={kind!r}: {_advice(phase, kind, dtype, reason)}."
    ins, outs = stats.get("inputs", []), stats.get("outputs", [])
    if ins or outs:
        msg += " " + _stats_line("inputs", ins) + "; " + _stats_line("outputs", outs) + "."
    return NonFiniteError(msg, phase=phase, module=module, op=op, kind=kind, sample=sample, stats=stats)


def _stats_line(label: str, items: list) -> str:
    def one(s):
        if s.get("absmax") is None:
            return f"all non-finite (nan {s['nan']}, inf {s['inf']})"
        bad = f", nan {s['nan']}, inf {s['inf']}" if s["nan"] or s["inf"] else ""
        return f"|x| in [{s['absmin']:.3g}, {s['absmax']:.3g}]{bad}"

    return f"{label}: " + (", ".join(one(s) for s in items[:4]) or "none")


# ------------------------------------------------------------------------------------------- headroom monitor
@dataclass
class HeadroomWarning:
    """An unnormalized path whose float32 abs-max left less than ``margin_bits`` of float16 headroom."""

    step: int
    start: str
    layers: tuple
    amax: float
    headroom_bits: float
    margin_bits: float
    message: str = ""


def headroom_warnings(
    path_amax: dict[str, tuple[tuple, float]], *, margin_bits: float, step: int, already: set | None = None
) -> list[HeadroomWarning]:
    """Warnings for paths (start -> (layers, abs-max)) with headroom below ``margin_bits``; ``already`` holds
    the starts warned before (each path warns once, and again only if it goes on to overflow)."""
    out = []
    for start, (layers, amax) in path_amax.items():
        bits = headroom_bits(amax)
        if bits is None or bits >= margin_bits:
            continue
        key = (start, bits < 0)
        if already is not None:
            if key in already:
                continue
            already.add(key)
        state = (
            "already exceeds the float16 range"
            if bits < 0
            else f"leaves {bits:.2f} bits of float16 headroom (< margin {margin_bits:g})"
        )
        msg = (
            f"ampsafe headroom: unnormalized path starting at {start!r} reached |x| = {amax:.4g} at step {step}: "
            f"{state}; float16 overflows at {FP16_MAX:g}. Protect it before it overflows: "
            f"ampsafe.patch(model, example_inputs, policy='auto') (FP32 island or exact rescale)."
        )
        out.append(HeadroomWarning(step, start, tuple(layers), float(amax), float(bits), float(margin_bits), msg))
    return out
