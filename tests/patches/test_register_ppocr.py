"""What the registration says it registered into PaddleOCR: only what PaddleOCR's own ``ppocr`` builds, and
plainly nothing when ppocr is not importable (the dbnet workload's builder is a different registry)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

no_ppocr = pytest.mark.skipif(importlib.util.find_spec("ppocr") is not None, reason="ppocr is importable here")


@no_ppocr
def test_without_ppocr_nothing_is_reported_as_registered_in_ppocr():
    # a fresh interpreter: a test before this one in the same worker may have imported ppocr from a PaddleOCR tree
    code = (
        "from ampsafe.patches import register_paddleocr\n"
        "from ampsafe.patches.register import ppocr_registration_line, registered_in_ppocr\n"
        "done = register_paddleocr()\n"
        "print(done == {'ppocr': None} and registered_in_ppocr() is None)\n"
        "print(ppocr_registration_line(done))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        "True",
        "safe necks registered (ppocr): none, PaddleOCR's ppocr package is not importable",
    ]
