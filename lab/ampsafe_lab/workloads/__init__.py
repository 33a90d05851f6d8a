"""Reference workloads from the user reports, on deterministic synthetic data (no downloads).

    w = ampsafe_lab.workloads.build("dbnet", seed=0)
    loss = w.loss(w.batch(step))

``dbnet`` (Paddle, PaddleOCR's DBNet rebuilt here), ``ppyolo`` (Paddle, built by PaddleDetection's own
registry from the upstream configs), ``frcnn`` (torchvision Faster R-CNN) and ``t5`` (HF transformers'
``T5ForConditionalGeneration``, the ``wo`` overflow of HF issue #5651), ``llama`` (HF's ``LlamaForCausalLM``
at a CPU size, for pure float16 under FSDP2) and ``ppocrv4_det`` (PaddleOCR's shipped,
trained PP-OCRv4 detector, Paddle or torch, on rendered pages). The upstream configs they build
from by default ship in ``data/upstream`` (see :mod:`.upstream`); ``heal_runs`` holds the self-healing runs
(GrowNet, the frcnn brink) that the heal tests and bench share.
"""

from __future__ import annotations

import importlib

from .base import Workload

__all__ = ["build", "names", "Workload"]

# name -> module that defines build(seed=..., **options) -> Workload
_BUILDERS = {
    "dbnet": "ampsafe_lab.workloads.dbnet",
    "ppyolo": "ampsafe_lab.workloads.ppyolo",
    "frcnn": "ampsafe_lab.workloads.frcnn",
    "t5": "ampsafe_lab.workloads.t5",
    "llama": "ampsafe_lab.workloads.llama",
    "ppocrv4_det": "ampsafe_lab.workloads.ppocrv4",
}


def names() -> list[str]:
    return sorted(_BUILDERS)


def build(name: str, *, seed: int = 0, **options) -> Workload:
    """Build workload ``name`` with seeded weights and data; options are passed to its builder."""
    from ampsafe.errors import ConfigError

    if name not in _BUILDERS:
        raise ConfigError(f"unknown workload {name!r}; choose one of {', '.join(names())}")
    module = importlib.import_module(_BUILDERS[name])
    return module.build(seed=seed, **options)
