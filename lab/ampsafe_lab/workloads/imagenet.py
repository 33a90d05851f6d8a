"""PaddleOCR's ``NormalizeImage`` + ``ToCHWImage``, as both OCR workloads feed their networks.

Kept apart from the workloads' data modules so each reads it without the other's dependencies (OpenCV and
pyclipper for ``dbnet``, the TrueType renderer for ``ppocrv4``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["IMAGE_MEAN", "IMAGE_STD", "normalize_chw"]

# ImageNet statistics, applied after scaling by 1/255
IMAGE_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGE_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def normalize_chw(image: np.ndarray) -> np.ndarray:
    """HWC image (uint8 or float, channels in the order given) -> contiguous float32 CHW: /255, minus the
    ImageNet mean, over its std."""
    scaled = np.asarray(image, dtype=np.float32) / 255.0
    return np.ascontiguousarray(((scaled - IMAGE_MEAN) / IMAGE_STD).transpose(2, 0, 1), dtype=np.float32)
