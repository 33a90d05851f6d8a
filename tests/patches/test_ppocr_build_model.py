"""Register the safe necks into PaddleOCR's real ``ppocr`` (the unmodified tree in ``shared/upstream/PaddleOCR-src``,
or ``$PADDLEOCR_SRC``) and build the swapped det_mv3_db.yml with PaddleOCR's own ``build_model``."""

from __future__ import annotations

import copy
import sys

import pytest


@pytest.fixture(scope="module")
def ppocr(paddleocr_src):
    sys.path.insert(0, str(paddleocr_src))
    try:
        import ppocr.modeling.architectures as architectures

        yield architectures
    finally:
        sys.path.remove(str(paddleocr_src))


def test_swapped_det_mv3_db_builds_with_paddleocrs_own_build_model(ppocr, upstream, tmp_path):
    import paddle
    import yaml

    from ampsafe.patches import register_paddleocr, swap_neck
    from ampsafe.patches.paddleocr_necks import AmpSafeDBFPN
    from ampsafe.patches.register import ppocr_registration_line, registered_in_ppocr

    done = register_paddleocr()
    assert "AmpSafeDBFPN" in done["ppocr"]
    assert register_paddleocr()["ppocr"] == done["ppocr"]  # idempotent
    assert registered_in_ppocr() == done["ppocr"]  # read back from ppocr's own build_neck
    assert ppocr_registration_line(done).startswith(f"safe necks registered (ppocr): {', '.join(done['ppocr'])}")
    out = swap_neck(upstream / "PaddleOCR/configs/det/det_mv3_db.yml", out=tmp_path / "det.yml")
    arch = yaml.safe_load(out.read_text())["Architecture"]
    model = ppocr.build_model(copy.deepcopy(arch))
    assert type(model.neck) is AmpSafeDBFPN
    original = ppocr.build_model(
        copy.deepcopy(yaml.safe_load((upstream / "PaddleOCR/configs/det/det_mv3_db.yml").read_text())["Architecture"])
    )
    missing = set(model.state_dict()) - set(original.state_dict())
    assert missing and all("_bn." in k for k in missing)
    assert set(original.state_dict()) <= set(model.state_dict())
    model.train()
    out = model(paddle.rand([1, 3, 64, 64]))
    assert out["maps"].shape[-2:] == [64, 64]
