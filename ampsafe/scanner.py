"""``ampsafe.scan``: which conv/matmul paths and ops would overflow float16, in which pass, before a long run dies.

    report = ampsafe.scan(model, example_inputs)              # torch.nn.Module or paddle.nn.Layer
    print(report.to_markdown())
    report = ampsafe.scan(model, inputs, loss_fn=lambda out: out.sum(), loss_scale=2.0**16)

The model's :class:`~ampsafe.core.backend.Backend` records one real forward per batch as a framework-neutral
graph (:mod:`ampsafe.core.record`); :mod:`ampsafe.core.paths` finds the paths and measures their headroom.
"""

from __future__ import annotations

import math
import numbers

from ._framework import backend_of
from .core.amp import check_level, check_target
from .core.model import unwrap
from .core.modpath import ancestors
from .core.paths import UNTRACED, analyze, merge_paths, merge_risky_ops
from .core.scan_report import ScanReport
from .core.sentinel import nonfinite_input
from .core.swaps import protection_of
from .errors import AmpSafeError, ConfigError

__all__ = ["scan", "ScanError"]

DEFAULT_LOSS_SCALE = 2.0**16  # torch's and Paddle's GradScaler initial scale


class ScanError(AmpSafeError, RuntimeError):
    """The model's forward (or ``loss_fn``) raised while ``scan`` traced it; the original is chained."""


def _check_args(example_inputs, level, target, margin_bits, loss_fn, loss_scale, calibration) -> None:
    check_level(level)
    check_target(target)
    if not isinstance(example_inputs, (tuple, dict)):
        raise ConfigError(
            "example_inputs must be a tuple of positional arguments or a dict of keyword arguments for "
            f"model(...), got {type(example_inputs).__name__}; wrap a single tensor as (x,)"
        )
    if not isinstance(margin_bits, numbers.Real) or not math.isfinite(margin_bits) or margin_bits < 0:
        raise ConfigError(f"margin_bits must be a finite number >= 0, got {margin_bits!r}")
    if loss_scale is not None:
        if loss_fn is None:
            raise ConfigError("loss_scale needs loss_fn: scan(model, inputs, loss_fn=lambda out: ..., loss_scale=S)")
        if not isinstance(loss_scale, numbers.Real) or not loss_scale > 0 or not math.isfinite(loss_scale):
            raise ConfigError(f"loss_scale must be a positive finite number, got {loss_scale!r}")
    if loss_fn is not None and not callable(loss_fn):
        raise ConfigError("loss_fn must be callable: loss_fn(output) -> scalar tensor")
    for i, batch in enumerate(calibration or ()):
        if not isinstance(batch, (tuple, dict)):
            raise ConfigError(f"calibration batch {i} must be a tuple or dict like example_inputs")


def _check_finite(backend, batch, which: str) -> None:
    """A NaN/Inf in the data makes every path after it non-finite, which says nothing about float16's range:
    a :class:`ScanError` names the input instead of a report that flags every path."""
    bad = nonfinite_input(((), batch) if isinstance(batch, dict) else (batch, {}), backend.tensors)
    if bad is not None:
        raise ScanError(
            f"{which} holds a non-finite value at {bad.text}: a NaN/Inf that comes in with the data makes every "
            "path after it non-finite, which is not a float16 overflow. Fix or drop that sample (or scan "
            "another batch); nothing was run."
        )


def _protection(modules: dict, path: str):
    """What ``ampsafe.patch`` did to ``path`` or an enclosing module, if anything (None when unpatched)."""
    for enclosing in ancestors(path):
        module = modules.get(enclosing)
        how = protection_of(module) if module is not None else None
        if how:
            return how
    return None


def scan(
    model,
    example_inputs,
    *,
    level: str = "O1",
    target: str = "cuda",
    calibration=None,
    margin_bits: float = 4.0,
    loss_fn=None,
    loss_scale: float | None = None,
) -> ScanReport:
    """Trace ``model`` on ``example_inputs`` (and each ``calibration`` batch) and report its float16 risks.

    Every conv/matmul starts a :class:`~ampsafe.RiskPath` (calls of a shared module merge into one);
    ``risky`` paths have less than ``margin_bits`` of headroom below 65504 or overflow a pass. With
    ``loss_fn`` the backward is measured at ``loss_scale`` (default 2**16) and ``overflows_in`` says which
    pass overflows. The model is left exactly as it was, also when its forward raises (:class:`ScanError`).
    """
    _check_args(example_inputs, level, target, margin_bits, loss_fn, loss_scale, calibration)
    backend = backend_of(model)  # first: resolving it teaches ``unwrap`` its framework's wrappers
    model = unwrap(model)
    if loss_fn is not None and loss_scale is None:
        loss_scale = DEFAULT_LOSS_SCALE
    batches = [example_inputs, *(calibration or ())]
    paths, ops, notes = [], [], []
    for i, batch in enumerate(batches):
        _check_finite(backend, batch, "example_inputs" if i == 0 else f"calibration batch {i - 1}")
        try:
            graph = backend.trace(model, batch, level=level, target=target, loss_fn=loss_fn, loss_scale=loss_scale)
        except AmpSafeError:
            raise
        except Exception as exc:
            which = "example_inputs" if i == 0 else f"calibration batch {i - 1}"
            raise ScanError(
                f"the model raised {type(exc).__name__} while ampsafe.scan ran it on {which}: {exc}. The model "
                "was left unchanged; check that model(*example_inputs) runs on its own."
            ) from exc
        p, o = analyze(graph, margin_bits=margin_bits, loss_scale=loss_scale)
        paths += p
        ops += o
        notes += [n for n in graph.notes if n not in notes]
    report = ScanReport(
        paths=merge_paths(paths, margin_bits=margin_bits, loss_scale=loss_scale),
        risky_ops=merge_risky_ops(ops),
        level=level,
        target=target,
        framework=backend.name,
        margin_bits=float(margin_bits),
        loss_scale=loss_scale,
        notes=notes,
        graph=graph,
    )
    untraced = [p.start for p in report.paths if UNTRACED in p.ends]
    if untraced:
        report.notes.append(
            f"{len(untraced)} path(s) lead into ops the tracer did not record ({', '.join(untraced[:5])}); they are "
            "reported as unnormalized"
        )
    modules = backend.modules(model)
    for p in report.paths:
        p.protected_by = _protection(modules, p.start)
    for o in report.risky_ops:
        o.protected_by = _protection(modules, o.module)
    return report
