"""``ampsafe.patch`` / ``ampsafe.unpatch``: fix what ``scan`` finds, in place, in one call, for torch and Paddle.

    report = ampsafe.patch(model, example_inputs)                  # policy="auto": islands + exact rewrites
    ampsafe.patch(model, policy="island", paths=["neck", "head.conv1"])
    ampsafe.unpatch(model)                                          # back to the original classes, exactly

A thin front: it validates, resolves the model's Backend, asks the policy's handler (a registry in
:mod:`ampsafe.policies`) for a plan and applies it transactionally: if any module fails to patch, every module
already patched is restored and the model is exactly as before. Every patch is a class swap (see
:mod:`ampsafe.core.swaps`), so parameters, their names and ``state_dict`` keys stay as they were
(``convbn`` adds documented ``<conv>.bn.*`` keys), parameter identity and optimizer state survive, patched
models pickle, and ``unpatch`` needs no record beyond the modules themselves. DDP/DataParallel wrappers are
looked through (``.module`` / ``._layers``).
"""

from __future__ import annotations

from typing import Any, Callable

from ._framework import backend_of
from .core.amp import check_level
from .core.model import unwrap
from .core.scan_report import PatchReport, ScanReport
from .core.swaps import protection_of, unswap
from .errors import ConfigError
from .policies import PatchContext, PolicyConfig, apply_change, handler, resolve
from .scanner import scan

__all__ = ["patch", "unpatch", "protection_of", "island_layers", "patched_modules"]


def _modules(model) -> dict:
    return backend_of(model).modules(unwrap(model))


def patch(
    model,
    example_inputs=None,
    *,
    policy: PolicyConfig | str = "auto",
    level: str = "O1",
    report: ScanReport | None = None,
    filter_fn: Callable[[Any, str], bool] | None = None,
    margin_bits: float | None = None,
    paths: list | None = None,
    **options,
) -> PatchReport:
    """Patch ``model`` in place with ``policy`` and return what changed.

    ``policy``: a config, or its shorthand name with the config's fields as ``**options``
    (``policy="convbn", act="relu"`` is ``policy=ampsafe.ConvBN(act="relu")``): ``Auto(margin_bits=4.0)``
    (islands for scan's risky paths, exact rewrites or islands for its risky ops), ``Island()`` (every
    unnormalized and every risky path in float32), ``ConvBN(act=None, optimizers=None)`` (a fresh BatchNorm
    after each unnormalized conv), ``Rescale(bits=None)`` (a power-of-two shift on homogeneous paths,
    compensated at their normalization), ``Rewrite()`` (``reciprocal(1+exp(-z))`` -> ``sigmoid(z)``).
    Targets come from ``paths=`` (RiskPaths or module paths) if given, else from ``report``, else from
    ``ampsafe.scan(model, example_inputs, level=level, margin_bits=margin_bits)`` (margin_bits: the config's
    if it has one, else 4.0). ``filter_fn(module, path) -> bool`` narrows them. Patching twice is a no-op.
    """
    backend = backend_of(model)  # UnsupportedModelError for anything else
    check_level(level)
    config = resolve(policy, options, shared={"margin_bits": margin_bits})
    margin_bits = getattr(config, "margin_bits", 4.0 if margin_bits is None else margin_bits)
    if report is not None and not isinstance(report, ScanReport):
        raise ConfigError(f"report must be an ampsafe.ScanReport, got {type(report).__name__}")
    if paths is not None and (isinstance(paths, str) or not hasattr(paths, "__iter__")):
        raise ConfigError("paths must be a list of module paths or RiskPaths, e.g. paths=['neck.in5_conv']")
    if filter_fn is not None and not callable(filter_fn):
        raise ConfigError("filter_fn must be callable as filter_fn(module, path) -> bool")
    inner = unwrap(model)
    ctx = PatchContext(
        model=inner,
        outer=model,
        backend=backend,
        level=level,
        modules=backend.modules(inner),
        report=report,
        paths=list(paths) if paths is not None else None,
        filter_fn=filter_fn,
        margin_bits=margin_bits,
        example_inputs=example_inputs,
        config=config,
        scan=scan,
    )
    plan = handler(config)(ctx)
    applied = []
    try:
        for change in plan.changes:
            module = ctx.modules[change.path]
            apply_change(backend.swaps, module, change)
            applied.append(module)
    except BaseException:
        for module in reversed(applied):
            unswap(module)
        raise
    out = PatchReport(policy=config.name, skipped=dict(plan.skipped), scan=ctx.report)
    for change in plan.changes:
        out.patched.append(change.path)
        out.details[change.path] = change.detail
    return out


def unpatch(model) -> None:
    """Give every patched module of ``model`` its original class back (and drop what the patch added).

    Parameters are the same objects throughout, so the state_dict is exactly the original one (``convbn``'s
    ``<conv>.bn.*`` entries go away with the BatchNorms).
    """
    for module in list(_modules(model).values()):
        unswap(module)


def patched_modules(model) -> dict[str, str]:
    """module path -> policy, for every patched module of ``model``."""
    mods = _modules(model)
    return {path: protection_of(m) for path, m in mods.items() if protection_of(m)}


def island_layers(model) -> list:
    """The FP32-island modules of ``model``: pass them to ``paddle.amp.decorate(..., level="O2",
    excluded_layers=ampsafe.patching.island_layers(model))`` so their weights stay float32 under O2."""
    mods = _modules(model)
    return [m for m in mods.values() if protection_of(m) == "island"]
