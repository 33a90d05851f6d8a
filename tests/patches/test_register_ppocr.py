"""What the registration says it registered into PaddleOCR: only what PaddleOCR's own ``ppocr`` builds, and
plainly nothing when ppocr is not importable (the dbnet workload's builder is a different registry)."""

from __future__ import annotations

import importlib.util

import pytest

from ampsafe.patches import register_paddleocr
from ampsafe.patches.register import ppocr_registration_line, registered_in_ppocr

no_ppocr = pytest.mark.skipif(importlib.util.find_spec("ppocr") is not None, reason="ppocr is importable here")


@no_ppocr
def test_without_ppocr_nothing_is_reported_as_registered_in_ppocr():
    done = register_paddleocr()
    assert done == {"ppocr": None} and registered_in_ppocr() is None
    line = ppocr_registration_line(done)
    assert line == "safe necks registered (ppocr): none, PaddleOCR's ppocr package is not importable"
