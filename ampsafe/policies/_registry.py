"""The policy registry: config type -> planning handler, change kind -> module swap, found by discovery.

Why a registry: a policy is one module that declares everything about itself (its config class, its handler,
the swaps its changes need and the protection name each records), so adding one edits nothing shared. The
registry fills as :mod:`ampsafe.policies` submodules are imported; :func:`_load` imports every public one
(``pkgutil.iter_modules``, modules whose name starts with ``_`` are skipped), so no import list exists.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar

from ..errors import ConfigError

__all__ = ["PolicyConfig", "register", "action", "resolve", "handler", "apply_change", "protection", "names"]


@dataclass(frozen=True)
class PolicyConfig:
    """Base of the typed policy configs (``ampsafe.Island()``, ``ampsafe.ConvBN(act="relu")``...).

    Frozen and hashable, validated in ``__post_init__`` (a bad field is a :class:`ampsafe.ConfigError` naming
    it). ``name`` is the string shorthand: ``policy="island"`` means ``Island()``.
    """

    name: ClassVar[str] = ""

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


_CONFIGS: dict[str, type[PolicyConfig]] = {}  # shorthand -> config class
_HANDLERS: dict[type, Callable] = {}  # config class -> fn(ctx) -> Plan
_ACTIONS: dict[str, tuple[Callable, str]] = {}  # change kind -> (fn(swaps, module, change), protection)


def register(config_cls: type[PolicyConfig]):
    """Decorator: ``fn(ctx) -> Plan`` plans the policy configured by ``config_cls`` (and its ``name``)."""
    if not (isinstance(config_cls, type) and issubclass(config_cls, PolicyConfig) and config_cls.name):
        raise TypeError(f"register() takes a PolicyConfig subclass with a name, got {config_cls!r}")

    def deco(fn):
        _CONFIGS[config_cls.name] = config_cls
        _HANDLERS[config_cls] = fn
        return fn

    return deco


def action(kind: str, *, protection: str):
    """Decorator: ``fn(swaps, module, change)`` swaps a module for changes of ``kind`` (``swaps``: the model's
    ``backend.swaps``, for the framework's mixins); a module patched so reports ``protection`` (the mixin's
    ``_ampsafe_protection``), which makes patching twice a no-op."""

    def deco(fn):
        _ACTIONS[kind] = (fn, protection)
        return fn

    return deco


def resolve(policy: Any, options: dict, shared: dict | None = None) -> PolicyConfig:
    """The config that ``policy`` (a config or a shorthand name) and ``**options`` describe.

    ``shared``: front-level settings (``margin_bits``) that a config may also hold as a field; None means unset.
    A shorthand takes them as field values; a config instance must not contradict them.
    """
    shared = {k: v for k, v in (shared or {}).items() if v is not None}
    if isinstance(policy, PolicyConfig):
        if options:
            raise ConfigError(
                f"options {', '.join(sorted(options))} go in the config: {type(policy).__name__}({next(iter(options))}=...)"
            )
        for key, value in shared.items():
            if key in policy.option_names() and getattr(policy, key) != value:
                raise ConfigError(f"{key}={value!r} contradicts {policy!r}: set {key} in one place")
        handler(policy)  # unregistered config types fail here, before anything is scanned
        return policy
    if isinstance(policy, type) and issubclass(policy, PolicyConfig):
        raise ConfigError(f"policy={policy.__name__} is a class: pass an instance, policy={policy.__name__}()")
    if not isinstance(policy, str):
        raise ConfigError(
            f"policy must be a policy name ({', '.join(names())}) or a config such as ampsafe.Island(), got {policy!r}"
        )
    cls = _lookup(_CONFIGS, policy)
    if cls is None:
        raise ConfigError(f"unknown policy {policy!r}; choose one of {', '.join(names())}")
    accepted = cls.option_names()
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ConfigError(
            f"policy {policy!r} takes no option {', '.join(unknown)} (its options: {', '.join(accepted) or 'none'})"
        )
    return cls(**{k: v for k, v in shared.items() if k in accepted}, **options)


def handler(config: PolicyConfig) -> Callable:
    """The planning handler registered for ``config``'s type (or its nearest registered base)."""
    for klass in type(config).__mro__:
        fn = _lookup(_HANDLERS, klass)
        if fn is not None:
            return fn
    raise ConfigError(f"no policy handler is registered for {type(config).__name__} (decorate one with register)")


def apply_change(swaps, module, change) -> None:
    """Swap ``module`` as ``change`` says, through the action registered for ``change.kind`` (``swaps``: the
    model's ``backend.swaps``)."""
    entry = _lookup(_ACTIONS, change.kind)
    if entry is None:
        raise ValueError(f"unknown patch action {change.kind!r}")
    entry[0](swaps, module, change)


def protection(kind: str) -> str:
    """The protection name a module patched by a change of ``kind`` reports."""
    entry = _lookup(_ACTIONS, kind)
    if entry is None:
        raise ValueError(f"unknown patch action {kind!r}")
    return entry[1]


def names() -> list[str]:
    """The shorthand names of every registered policy."""
    _load()
    return sorted(_CONFIGS)


def _lookup(table: dict, key):
    if key not in table:
        _load()
    return table.get(key)


def _load() -> None:
    """Import every public module of :mod:`ampsafe.policies`; each registers itself on import."""
    package = importlib.import_module(__package__)
    for info in pkgutil.iter_modules(package.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"{package.__name__}.{info.name}")
