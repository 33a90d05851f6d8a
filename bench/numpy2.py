"""``numpy.sctypes`` for imgaug 0.4.0, which PaddleOCR's and PaddleDetection's trees import: imgaug reads it at
import, and NumPy 2 removed it. The bench scripts that run those trees set it before imgaug imports (in process, or
from the ``sitecustomize`` they give their children, with the checkout on ``PYTHONPATH``)."""

from __future__ import annotations


def set_sctypes() -> None:
    """Put back NumPy 1's ``numpy.sctypes`` table when this NumPy has none; nothing else changes."""
    import numpy as np

    if "sctypes" not in vars(np):
        np.sctypes = {
            "int": [np.int8, np.int16, np.int32, np.int64],
            "uint": [np.uint8, np.uint16, np.uint32, np.uint64],
            "float": [np.float16, np.float32, np.float64, np.longdouble],
            "complex": [np.complex64, np.complex128, np.clongdouble],
            "others": [bool, object, bytes, str, np.void],
        }
