"""DBFPN: PaddleOCR's DB neck, eight bias-free convs with no normalization after them.

That missing normalization is the point of this workload: the concat it returns is unbounded, and the head's
first conv multiplies it up past float16's range once training pushes the weights (see ``brink``). The class is
defined once, beside its AMP-safe variant, in :mod:`ampsafe.patches.paddleocr_necks`.
"""

from __future__ import annotations

from ampsafe.patches.paddleocr_necks import DBFPN

__all__ = ["DBFPN"]
