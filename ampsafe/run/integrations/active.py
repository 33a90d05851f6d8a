"""Whether the integrations act: a module of its own, below the registry in ``__init__`` that imports them all."""

from __future__ import annotations

import sys

__all__ = ["emulating"]


def emulating() -> bool:
    """``--emulate-fp16`` is in force (installed, and torch has no CUDA): the integrations act only then."""
    emulation = sys.modules.get("ampsafe.torch.cuda_emulation")
    return emulation is not None and emulation.active()
