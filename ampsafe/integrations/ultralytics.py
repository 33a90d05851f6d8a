"""``add_callbacks(model)`` for ultralytics, by the name users import it: ``from ampsafe.integrations.ultralytics
import add_callbacks``. It is written in :mod:`ampsafe.hosts.ultralytics`, with everything else ampsafe knows
about ultralytics."""

from __future__ import annotations

from ..hosts.ultralytics import add_callbacks, epoch_end_callback

__all__ = ["add_callbacks", "epoch_end_callback"]
