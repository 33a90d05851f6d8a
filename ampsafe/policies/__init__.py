"""Patch policies (``island``, ``convbn``, ``rescale``, ``rewrite``, ``auto``) behind ``ampsafe.patch``.

Each policy is one small module with a handler registered here under its name. A handler only *plans*: it
reads the scan report (or the explicit ``paths=``) and returns a :class:`Plan` of :class:`Change` records;
``ampsafe.patching`` applies the plan transactionally through the framework adapter
(``ampsafe.torch.patch`` / ``ampsafe.paddle.patch``). Selection logic is framework-neutral: a handler sees
modules only through the adapter's predicates (``is_conv``, ``has_bias``, ``is_norm``...).

A new policy is one new module that calls :func:`register`, not an edit to a long if/else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..core.report import RiskPath, ScanReport
from ..errors import ConfigError

__all__ = ["Change", "Plan", "PatchContext", "register", "handler", "names", "under", "path_starts"]


@dataclass
class Change:
    """One module to patch: ``kind`` is the adapter action ("island", "convbn", "rescale_input",
    "rescale_norm", "rewrite"), ``path`` the module path, ``detail`` the sentence the report shows."""

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
    """What a handler may read. ``modules``: path -> module of the unwrapped model; ``outer``: the model as
    the user passed it (DDP wrapper included); ``options``: the policy's extra keyword arguments."""

    model: Any
    outer: Any
    adapter: Any
    level: str
    modules: dict
    report: ScanReport | None = None
    paths: list | None = None
    filter_fn: Callable | None = None
    margin_bits: float = 4.0
    example_inputs: Any = None
    options: dict = field(default_factory=dict)

    def scan_report(self, why: str) -> ScanReport:
        """The scan report, running ``ampsafe.scan`` on ``example_inputs`` when none was given."""
        if self.report is None:
            if self.example_inputs is None:
                raise ConfigError(
                    f"{why}: pass example_inputs (a tuple of model arguments) so ampsafe can scan the model, "
                    "or report=ampsafe.scan(...), or paths=[module paths]"
                )
            from ..scanner import scan

            restore = self.adapter.save_buffers(self.model)  # a traced train-mode forward moves BN statistics
            try:
                self.report = scan(self.model, self.example_inputs, level=self.level, margin_bits=self.margin_bits)
            finally:
                restore()
        return self.report

    def allowed(self, path: str, plan: Plan, *, kind: str) -> bool:
        """Whether ``path`` may be patched with ``kind``: it exists, is not already patched by another policy,
        and ``filter_fn`` accepts it. Records the reason in ``plan.skipped`` otherwise."""
        module = self.modules.get(path)
        if module is None:
            raise ConfigError(f"the model has no module {path!r} (spell paths as named_modules()/named_sublayers())")
        from ._swap import protection_of

        current = protection_of(module)
        if current == _PROTECTION[kind]:
            return False  # already done: patching twice is a no-op
        if current is not None:
            plan.skipped[path] = f"already patched by {current!r}"
            return False
        if self.filter_fn is not None and not self.filter_fn(module, path):
            plan.skipped[path] = "excluded by filter_fn"
            return False
        return True


_PROTECTION = {
    "island": "island",
    "convbn": "convbn",
    "rescale_input": "rescale",
    "rescale_norm": "rescale",
    "rewrite": "rewrite",
}

_REGISTRY: dict[str, tuple[Callable[[PatchContext], Plan], frozenset]] = {}


def register(name: str, *, options: tuple[str, ...] = ()):
    """Decorator: register ``fn(ctx) -> Plan`` as policy ``name`` accepting the extra keyword ``options``."""

    def deco(fn):
        _REGISTRY[name] = (fn, frozenset(options))
        return fn

    return deco


def handler(name: str):
    """(handler, accepted option names) of policy ``name``."""
    _load()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown policy {name!r}; choose one of {', '.join(names())}")
    return _REGISTRY[name]


def names() -> list[str]:
    _load()
    return sorted(_REGISTRY)


def _load() -> None:
    from . import auto, convbn, island, rescale, rewrite  # noqa: F401  (each registers itself)


def under(path: str, ancestor: str) -> bool:
    """Whether module ``path`` is ``ancestor`` or inside it ("" is the root, above everything)."""
    return ancestor == "" or path == ancestor or path.startswith(ancestor + ".")


def path_starts(paths) -> list[str]:
    """Start module paths of explicit ``paths=`` items (RiskPath or str)."""
    return [p.start if isinstance(p, RiskPath) else str(p) for p in paths]
