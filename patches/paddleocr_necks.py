"""PaddleOCR's DB-family necks (DBFPN, RSEFPN, LKPAN) and their AMP-safe variants, by their ``ampsafe.patches`` name.

    from ampsafe.patches.paddleocr_necks import AmpSafeDBFPN   # paddle is imported here, on first use

The classes are defined once, in :mod:`ampsafe.paddle.nets.paddleocr_necks`: they are Paddle code, and outside
``ampsafe/torch/`` and ``ampsafe/paddle/`` no module imports a framework when it is imported. Each name below
resolves to that class the first time it is read, so ``ampsafe swap-neck`` and ``import ampsafe.patches`` stay
free of paddle.
"""

from __future__ import annotations

from ampsafe._lazy import lazy_attributes

# the public names of ampsafe.paddle.nets.paddleocr_necks (its __all__ is this list); any public name (these and its
# helpers, e.g. DSConv) is read from there the first time it is used
_NAMES = (
    "DBFPN",
    "RSEFPN",
    "LKPAN",
    "AmpSafeDBFPN",
    "AmpSafeRSEFPN",
    "AmpSafeLKPAN",
    "AmpSafeIntraCLBlock",
    "PADDLEOCR_NECKS",
)
__all__ = list(_NAMES)


__getattr__, __dir__ = lazy_attributes(__name__, "ampsafe.paddle.nets.paddleocr_necks", _NAMES, any_public=True)
