"""``AmpSafeHook`` for mmengine, by the name a config imports: ``custom_imports =
dict(imports=["ampsafe.integrations.mmengine"])``, then ``custom_hooks = [dict(type="AmpSafeHook")]``. It is
written in :mod:`ampsafe.hosts.mmengine`, with everything else ampsafe knows about mmengine.

Importing this module in a process that has imported mmengine (as ``custom_imports`` does) registers the hook
in mmengine's ``HOOKS``, even when :mod:`ampsafe.hosts.mmengine` was imported before mmengine was."""

from __future__ import annotations

import sys

from ..hosts.mmengine import __getattr__, register, scaler_of  # noqa: F401 - __getattr__ builds AmpSafeHook

__all__ = ["AmpSafeHook", "register", "scaler_of"]  # noqa: F822 - AmpSafeHook is built on first use (__getattr__)

if "mmengine" in sys.modules:
    register()
