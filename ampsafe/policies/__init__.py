"""Patch policies (``island``, ``convbn``, ``rescale``, ``rewrite``, ``auto``) behind ``ampsafe.patch``.

Each policy is one small module that declares, for the registry in :mod:`ampsafe.policies._registry`: a
frozen config dataclass (a :class:`PolicyConfig` such as ``Island()``, its ``name`` the string shorthand), the
handler planning it (:func:`register`, keyed by config type) and the module swap of each change kind it plans
with the protection name that swap records (:func:`action`). A handler only *plans*: it reads the scan report
(or the explicit ``paths=``) and returns a :class:`Plan` of :class:`Change` records; ``ampsafe.patching``
applies the plan transactionally, each change through the action registered for its kind (:func:`apply_change`),
which swaps the module's class (:mod:`ampsafe.core.swaps`). Selection logic is framework-neutral: a handler sees
modules only through the model's Backend, its paths (``ctx.modules``) and its ``swaps`` part (``is_conv``,
``has_bias``..., ``ampsafe.torch.swaps`` / ``ampsafe.paddle.swaps``).

Policy modules are discovered (every public submodule is imported on first use), so a new policy is one new
module: no shared if/else, table or import list to edit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..core.modpath import parts, under
from ..core.scan_report import RiskPath, ScanReport
from ..core.swaps import protection_of
from ..errors import ConfigError
from ._registry import PolicyConfig, action, apply_change, handler, names, protection, register, resolve

__all__ = [
    "PolicyConfig",
    "Change",
    "Plan",
    "PatchContext",
    "register",
    "action",
    "resolve",
    "handler",
    "apply_change",
    "protection",
    "names",
    "under",
    "path_starts",
]


@dataclass
class Change:
    """One module to patch: ``kind`` names a registered action ("island", "convbn", "rescale_input",
    "rescale_norm", "rewrite"...), ``path`` the module path, ``detail`` the sentence the report shows."""

    kind: str
    path: str
    detail: str = ""
    params: dict = field(default_factory=dict)


@dataclass
class Plan:
    changes: list[Change] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def add(self, change: Change) -> None:
        if all(c.path != change.path for c in self.changes):
            self.changes.append(change)


@dataclass
class PatchContext:
    """What a handler may read. ``modules``: path -> module of the unwrapped model (``backend.modules``);
    ``outer``: the model as the user passed it (DDP wrapper included); ``backend``: the model's Backend, whose
    ``swaps`` part (:attr:`swaps`) says what a module is; ``config``: the policy's typed config
    (``ConvBN(act=...)``); ``scan``: how to scan the model when no report was given (``ampsafe.patch`` hands
    ``ampsafe.scan`` down: the policies never import the front)."""

    model: Any
    outer: Any
    backend: Any
    level: str
    modules: dict
    report: ScanReport | None = None
    paths: list | None = None
    filter_fn: Callable | None = None
    margin_bits: float = 4.0
    example_inputs: Any = None
    config: PolicyConfig | None = None
    scan: Callable | None = None

    @property
    def swaps(self):
        """The framework's :class:`~ampsafe.core.swaps.Swaps`: its conv and norm types, island mixin..."""
        return self.backend.swaps

    def scan_report(self, why: str) -> ScanReport:
        """The scan report, running ``ampsafe.scan`` on ``example_inputs`` when none was given."""
        if self.report is None:
            if self.example_inputs is None:
                raise ConfigError(
                    f"{why}: pass example_inputs (a tuple of model arguments) so ampsafe can scan the model, "
                    "or report=ampsafe.scan(...), or paths=[module paths]"
                )
            if self.scan is None:
                raise ConfigError(f"{why}: no scan was handed to this PatchContext; pass report= or paths=")
            with self.backend.replay(self.model):  # a traced train-mode forward moves BN statistics
                self.report = self.scan(self.model, self.example_inputs, level=self.level, margin_bits=self.margin_bits)
        return self.report

    def allowed(self, path: str, plan: Plan, *, kind: str) -> bool:
        """Whether ``path`` may be patched with ``kind``: it exists, is not already patched by another policy,
        and ``filter_fn`` accepts it. Records the reason in ``plan.skipped`` otherwise."""
        module = self.modules.get(path)
        if module is None:
            raise ConfigError(self._unknown(path))
        current = protection_of(module)
        if current == protection(kind):
            return False  # already done: patching twice is a no-op
        if current is not None:
            plan.skipped[path] = f"already patched by {current!r}"
            return False
        if self.filter_fn is not None and not self.filter_fn(module, path):
            plan.skipped[path] = "excluded by filter_fn"
            return False
        return True

    def _unknown(self, path: str) -> str:
        """Why ``path`` is no key of :attr:`modules`: no such module, or a second path to a module the model
        holds twice (``modules`` names each module once, by the first path ``named_modules()`` gives)."""
        module = self.model
        for name in parts(path):
            module = getattr(module, name, None)
        first = next((p for p, m in self.modules.items() if m is module), None) if module is not None else None
        if first is not None:
            return (
                f"{path!r} is a second path to the module {first!r} (the model holds it twice): "
                f"name it {first!r}, as named_modules()/named_sublayers() do"
            )
        return f"the model has no module {path!r} (spell paths as named_modules()/named_sublayers())"


def path_starts(paths) -> list[str]:
    """Start module paths of explicit ``paths=`` items (RiskPath or str)."""
    return [p.start if isinstance(p, RiskPath) else str(p) for p in paths]
