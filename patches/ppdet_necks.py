"""PaddleDetection's FPN with a normalization after each conv (``AmpSafeFPN``), by its ``ampsafe.patches`` name.

    from ampsafe.patches.ppdet_necks import AmpSafeFPN   # paddle and ppdet are imported here, on first use

The class is defined once, in :mod:`ampsafe.paddle.nets.ppdet_necks` (which also says why the PP-YOLO necks need
no variant): it is Paddle code, and outside ``ampsafe/torch/`` and ``ampsafe/paddle/`` no module imports a
framework when it is imported. Each name below resolves the first time it is read.
"""

from __future__ import annotations

from ampsafe._lazy import lazy_attributes

# the public names of ampsafe.paddle.nets.ppdet_necks (its __all__ is this list); any public name is read from there
# the first time it is used
_NAMES = (
    "AmpSafeFPN",
    "normalized_conv_report",
    "NORM_SUFFIX",
)
__all__ = list(_NAMES)


__getattr__, __dir__ = lazy_attributes(__name__, "ampsafe.paddle.nets.ppdet_necks", _NAMES, any_public=True)
