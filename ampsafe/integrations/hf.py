"""``AmpCallback`` for HF ``Trainer``, by the name users import it: ``from ampsafe.integrations.hf import
AmpCallback``. It is written in :mod:`ampsafe.hosts.hf`, with everything else ampsafe knows about HF."""

from __future__ import annotations

from ..hosts.hf import __getattr__, add_callback  # noqa: F401 - __getattr__ builds AmpCallback on first use

__all__ = ["AmpCallback", "add_callback"]  # noqa: F822 - AmpCallback is built on first use (__getattr__)
