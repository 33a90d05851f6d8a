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
    from ampsafe.workloads.dbnet import builder

    done = register_paddleocr()
    assert done["ppocr"] is None and registered_in_ppocr() is None
    assert builder.NECKS["AmpSafeDBFPN"]  # the dbnet builder has them: that is not PaddleOCR's registry
    line = ppocr_registration_line(done)
    assert line.startswith("safe necks registered (ppocr): none, PaddleOCR's ppocr package is not importable")


@no_ppocr
def test_dbnet_builder_names_are_named_apart_from_ppocr():
    line = ppocr_registration_line({"dbnet": ["AmpSafeDBFPN", "AmpSafeLKPAN"], "ppocr": None})
    ppocr_part, dbnet_part = line.split("; ")
    assert "AmpSafe" not in ppocr_part
    assert dbnet_part == "ampsafe's own DBNet builder, not PaddleOCR's, got AmpSafeDBFPN, AmpSafeLKPAN"
    assert ppocr_registration_line({"dbnet": [], "ppocr": None}).endswith("is not importable")
