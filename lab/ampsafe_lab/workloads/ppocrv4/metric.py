"""Held-out hmean as PaddleOCR measures it: its own ``DBPostProcess`` and ``DetMetric``, from a PaddleOCR tree.

    metric = paddleocr_hmean(workload, n_pages=16)      # {"precision", "recall", "hmean"}

The two classes are imported at run time from the tree :func:`~ampsafe_lab.workloads.ppocrv4.paddleocr_src` finds,
never copied. ``ppocr/postprocess/__init__.py`` and ``ppocr/metrics/__init__.py`` import every post-process and
metric PaddleOCR has (scikit-image, rapidfuzz, ...), so the two modules are loaded as members of stand-in
packages whose search path is the tree's folder: their own files run, their package ``__init__`` does not.
The post-process takes the config's ``PostProcess`` options; pages are fed at their rendered size (ratio 1).
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import numpy as np

from ampsafe.errors import ConfigError

__all__ = ["paddleocr_classes", "paddleocr_hmean"]

# stand-in package name -> the tree's folder it reads modules from
_PACKAGES = {"_ampsafe_ppocr_postprocess": "ppocr/postprocess", "_ampsafe_ppocr_metrics": "ppocr/metrics"}


def _module(src: Path, package: str, name: str):
    if package not in sys.modules:
        stand_in = types.ModuleType(package)
        stand_in.__path__ = [str(src / _PACKAGES[package])]
        sys.modules[package] = stand_in
    return importlib.import_module(f"{package}.{name}")


def paddleocr_classes(src: Path | None = None) -> tuple[type, type]:
    """``(DBPostProcess, DetMetric)`` from the PaddleOCR tree at ``src`` (default: the one the workload finds)."""
    from . import paddleocr_src

    src = src or paddleocr_src()
    if src is None:
        raise ConfigError("PaddleOCR's DBPostProcess and DetMetric come from a PaddleOCR tree: set PADDLEOCR_SRC")
    post = _module(Path(src), "_ampsafe_ppocr_postprocess", "db_postprocess").DBPostProcess
    metric = _module(Path(src), "_ampsafe_ppocr_metrics", "det_metric").DetMetric
    return post, metric


def paddleocr_hmean(workload, n_pages: int = 16) -> dict:
    """Precision, recall and hmean of ``workload``'s model on its first ``n_pages`` held-out pages, boxes by
    PaddleOCR's ``DBPostProcess`` (the config's options) and scored by its ``DetMetric`` (IoU 0.5)."""
    post_cls, metric_cls = paddleocr_classes()
    options = {k: v for k, v in workload.config.get("PostProcess", {}).items() if k != "name"}
    post, metric = post_cls(**options), metric_cls()
    from .pages import normalize

    done = 0
    for step in range((n_pages + workload.batch_size - 1) // workload.batch_size):
        pages = workload.pages(step, held_out=True)[: n_pages - done]
        done += len(pages)
        maps = workload.maps(np.stack([normalize(page.image) for page in pages]))
        shapes = [[p.image.shape[0], p.image.shape[1], 1.0, 1.0] for p in pages]
        predictions = post({"maps": maps}, shapes)
        polys = [p.polys for p in pages]
        ignore = [np.zeros(len(p), dtype=bool) for p in polys]
        metric(predictions, [None, shapes, polys, ignore])
    return {k: float(v) for k, v in metric.get_metric().items()}
