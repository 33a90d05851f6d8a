"""``AmpMetricsCallback`` for Lightning, by the name users import it: ``from ampsafe.integrations.lightning
import AmpMetricsCallback``. It is written in :mod:`ampsafe.hosts.lightning`, with everything else ampsafe knows
about Lightning."""

from __future__ import annotations

from ..hosts.lightning import __getattr__, callback_class, scaler_of  # noqa: F401 - __getattr__ builds the class

__all__ = ["AmpMetricsCallback", "callback_class", "scaler_of"]  # noqa: F822 - built on first use (__getattr__)
