"""Whether ``--emulate-fp16`` is in force: each integration acts only then (a module of its own, so that the
integrations and their registry, :mod:`ampsafe.run.integrations`, import it without importing each other)."""

from __future__ import annotations

import sys

__all__ = ["emulating"]


def emulating() -> bool:
    """``--emulate-fp16`` is in force (installed, and torch has no CUDA): the integrations act only then."""
    emulation = sys.modules.get("ampsafe.torch.cuda_emulation")
    return emulation is not None and emulation.active()
