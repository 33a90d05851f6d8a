"""Ready-made patches for upstream model families (installed as ``ampsafe.patches``): AMP-safe necks for
PaddleOCR and PaddleDetection, their registration, and the config neck swap.

    ampsafe.patches.swap_neck("configs/det/det_mv3_db.yml", out="det_mv3_db_safe.yml")
    ampsafe.patches.register_paddleocr()   # AmpSafeDBFPN / RSEFPN / LKPAN / FCEFPN / FPN_UNet / TableFPN by name
    ampsafe.patches.register_paddledet()   # AmpSafeFPN / CLRFPN / HRFPN in ppdet's workspace

``ampsafe swap-neck --list`` prints, for every neck class of PaddleOCR and PaddleDetection, whether it has a safe
variant, needs none (the measured reason) or is not covered (why): :func:`registry.render_neck_table`, checked
against :func:`neck_check.check_neck` (``ampsafe.scan`` on the built neck: is there an unnormalized path to its
output?).

The neck classes are Paddle code, defined in :mod:`ampsafe.paddle.nets` (``paddleocr_necks`` and ``ppdet_necks``
here re-export them by name); nothing here imports paddle until a neck is built or registered.
"""

from __future__ import annotations

from .registry import SAFE_NECKS, safe_neck
from .swap import swap_neck

__all__ = ["swap_neck", "register_paddleocr", "register_paddledet", "SAFE_NECKS", "safe_neck"]


def register_paddleocr() -> dict:
    from .register import register_paddleocr as register

    return register()


def register_paddledet() -> list[str]:
    from .register import register_paddledet as register

    return register()
