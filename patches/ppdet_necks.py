"""PaddleDetection's FPN with a normalization after each conv (``AmpSafeFPN``), by its ``ampsafe.patches`` name.

    from ampsafe.patches.ppdet_necks import AmpSafeFPN   # paddle and ppdet are imported here, on first use

The class is defined once, in :mod:`ampsafe.paddle.nets.ppdet_necks` (which also says why the PP-YOLO necks need
no variant): it is Paddle code, and outside ``ampsafe/torch/`` and ``ampsafe/paddle/`` no module imports a
framework when it is imported. Each name below resolves the first time it is read.
"""

from __future__ import annotations

# the public names of ampsafe.paddle.nets.ppdet_necks; any public name is read from there the first time it is used
_NAMES = (
    "AmpSafeFPN",
    "normalized_conv_report",
    "NORM_SUFFIX",
)
__all__ = list(_NAMES)


def __getattr__(name: str):
    if name.startswith("_"):  # dunder probes (__path__, ...) and private helpers: not forwarded
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from ampsafe.paddle.nets import ppdet_necks

    value = getattr(ppdet_necks, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_NAMES))
