"""The trainers ampsafe works inside, one module each: everything ampsafe knows about one trainer in one file.

Why one module per trainer: what ampsafe does for a trainer (the logger object a user adds by hand, adding it
under ``ampsafe run``, the ``--emulate-fp16`` switch at its AMP decision, its fix lines) changes when the
trainer changes, so it is read, tested and versioned together. Adding a trainer is one new module here; the
run reads every one through this registry and edits no list.

Each public module declares ``HOST``, a :class:`Host`: the modules whose import installs each part, and the
functions that install them. The run hands an installer its :class:`~ampsafe.run.session.RunSession` (its
banner, its list of changes, its ledger); a host never imports the run.

- ``registers``: module -> ``fn(session, module)``, always under ``ampsafe run`` (PaddleOCR's and ppdet's
  AMP-safe necks, so that swapped configs build; HF ``generate``'s heal of a float16 overflow in the trained
  model, :mod:`ampsafe.hosts._generation`);
- ``loggers``: module -> ``fn(session, module)``, the ``amp/*`` metrics added to the trainer's own loggers
  (off with ``--no-metrics``); the object added is the one a user adds in code (``ampsafe.integrations``);
- ``emulation`` and ``emulate``: ``--emulate-fp16`` for a trainer that chooses AMP from the device type. On a
  machine without CUDA, ``--emulate-fp16`` makes ``torch.autocast("cuda")`` CPU float16 autocast with CUDA's
  op lists and ``GradScaler("cuda")`` a scaling CPU scaler (:mod:`ampsafe.torch.cuda_emulation`); a trainer
  that never asks for "cuda" on a CPU never reaches them (accelerate keeps ``native_amp=False``, Lightning
  rewrites ``16-mixed`` to ``bf16-mixed``, mmengine's ``AmpOptimWrapper`` asserts a GPU, ultralytics'
  ``check_amp`` returns False). ``emulate(module, set_attr, tell) -> str`` changes that one decision, so the
  trainer takes its own GPU float16 path with tensors on the CPU (``torch.cuda.is_available()`` is never
  faked: the trainers would move tensors to CUDA). ``emulation`` maps each module whose import installs it to
  the attributes it patches: a version without one of them gets one warning line (:func:`apply`), never an
  error. ``set_attr(owner, name, value)`` patches one attribute (in the run's ledger), ``tell(line)`` puts a
  line in the banner when the switch acts.
- ``static_scale``: ``fn(scale) -> dict`` with the trainer's own words for a dynamic loss scale starting at
  ``scale`` (``trainer``, ``source``: the settings that built the static scaler, ``config``: key -> value,
  ``overrides``: the command-line form, ``overrides_note``: where it goes), for a run whose
  scaler was built static at scale 1 (:mod:`ampsafe.run.static_scale`); the host answers when one of its
  modules is imported (:func:`running`).

No host module imports its trainer, or a framework, when it is imported: each reaches them inside the
functions that need them.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["Host", "hosts", "install", "targets", "apply", "emulating", "running"]


@dataclass(frozen=True)
class Host:
    """What ampsafe does for one trainer, keyed by the module whose import installs each part (see the
    package's docstring). ``name``: the trainer as the banner's lines spell it."""

    name: str
    registers: Mapping[str, Callable] = field(default_factory=dict)
    loggers: Mapping[str, Callable] = field(default_factory=dict)
    emulation: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    emulate: Callable | None = None
    static_scale: Callable | None = None

    @property
    def modules(self) -> tuple[str, ...]:
        """The trainer's modules this host hooks (any of them imported: the trainer is running)."""
        return (*self.registers, *self.loggers, *self.emulation)


@functools.cache
def hosts() -> dict[str, Host]:
    """Name -> :class:`Host` of every public module of this package, in module-name order (discovered: a new
    trainer is one new module, no list to edit)."""
    found = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        host = importlib.import_module(f"{__name__}.{info.name}").HOST
        found[host.name] = host
    return found


def running() -> list[Host]:
    """The hosts whose trainer this process has imported (one of :attr:`Host.modules` in ``sys.modules``)."""
    return [h for h in hosts().values() if any(m in sys.modules for m in h.modules)]


def install(session) -> None:
    """Hook every host's parts into ``session``: each installs when its module is imported (now, for one
    already imported). The necks always, ``--emulate-fp16``'s switches with that option, the loggers unless
    ``--no-metrics``; in that order, so on one module the switch is in place before the logger."""
    for host in hosts().values():
        for target, fn in host.registers.items():
            session.finder.when_imported(target, lambda module, _fn=fn: _fn(session, module))
    if session.options.emulate_fp16:
        for name, target in targets():
            session.finder.when_imported(target, lambda module, _name=name: _emulate(session, _name, module))
    if session.options.metrics:
        for host in hosts().values():
            for target, fn in host.loggers.items():
                session.finder.when_imported(target, lambda module, _fn=fn: _fn(session, module))


def targets() -> list[tuple[str, str]]:
    """(host, module whose import installs its ``--emulate-fp16`` switch) pairs."""
    return [(name, target) for name, host in hosts().items() if host.emulate for target in host.emulation]


def emulating() -> bool:
    """``--emulate-fp16`` is in force (installed, and torch has no CUDA): the switches act only then."""
    emulation = sys.modules.get("ampsafe.torch.cuda_emulation")
    return emulation is not None and emulation.active()


def _emulate(session, name: str, module) -> None:
    """One host's switch; its lines go to the banner and the changes, each once."""

    def tell(line: str) -> None:
        if line not in session.changes:
            session.changes.append(line)
            session.say(line)

    tell(apply(name, module, session.set_attr, tell))


def apply(name: str, module, set_attr: Callable, tell: Callable[[str], None]) -> str:
    """Install host ``name``'s ``--emulate-fp16`` switch on the imported ``module``; the line saying what it
    patched, or a warning line when the trainer's version lacks what the switch patches."""
    host = hosts()[name]
    missing = [attr for attr in host.emulation.get(module.__name__, ()) if _lookup(module, attr) is None]
    version = _version(module.__name__)
    if missing:
        return (
            f"warning: --emulate-fp16 {name} integration not installed: {module.__name__} {version} has no "
            f"{', '.join(missing)} (a version it does not know); that trainer's AMP stays as the framework decides"
        )
    try:
        return host.emulate(module, set_attr, tell)
    except Exception as exc:  # noqa: BLE001 - an unknown version: one warning line, training goes on
        return (
            f"warning: --emulate-fp16 {name} integration not installed on {module.__name__} {version} "
            f"({type(exc).__name__}: {exc}); that trainer's AMP stays as the framework decides"
        )


def _lookup(module, dotted: str):
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _version(module_name: str) -> str:
    from importlib import metadata

    top = module_name.split(".")[0]
    for dist in (top, top.replace("_", "-")):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "(version unknown)"
