"""The four upstream DB configs build; bad configs fail with ConfigError; the neck registry is open."""

from __future__ import annotations

import pytest

paddle = pytest.importorskip("paddle")

from ampsafe.errors import ConfigError  # noqa: E402
from ampsafe.paddle.nets.paddleocr_necks import DBFPN  # noqa: E402
from ampsafe_lab.workloads import build  # noqa: E402
from ampsafe_lab.workloads.dbnet import NECKS, build_model, register_neck  # noqa: E402
from ampsafe_lab.workloads.dbnet.config import BUILTIN_DET_MV3_DB, load_config  # noqa: E402

CONFIGS = {
    "det_mv3_db.yml": ("MobileNetV3", [16, 24, 56, 480], 256),
    "ch_ppocr_v2.0/ch_det_mv3_db_v2.0.yml": ("MobileNetV3", [16, 24, 56, 480], 96),
    "det_r50_vd_db.yml": ("ResNet_vd", [256, 512, 1024, 2048], 256),
    "det_res18_db_v2.0.yml": ("ResNet_vd", [64, 128, 256, 512], 256),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_upstream_db_config_builds_and_runs(upstream, name):
    backbone, channels, neck_channels = CONFIGS[name]
    config = load_config(upstream / "PaddleOCR" / "configs" / "det" / name)
    model = build_model(config["Architecture"])
    assert type(model.backbone).__name__ == backbone
    assert model.backbone.out_channels == channels
    assert model.neck.out_channels == neck_channels
    model.eval()
    with paddle.no_grad():
        maps = model(paddle.rand([1, 3, 64, 64]))["maps"]
    assert maps.shape == [1, 1, 64, 64]
    assert float(maps.min()) >= 0.0 and float(maps.max()) <= 1.0


def test_v2_config_disables_squeeze_excite(upstream):
    config = load_config(upstream / "PaddleOCR" / "configs" / "det" / "ch_ppocr_v2.0" / "ch_det_mv3_db_v2.0.yml")
    names = build_model(config["Architecture"]).state_dict().keys()
    assert not any("mid_se" in n for n in names)


def test_config_names_resolve_under_upstream(upstream_tree):
    by_name = load_config("det_res18_db_v2.0")
    assert by_name["Architecture"]["Backbone"] == {"name": "ResNet_vd", "layers": 18}
    assert load_config("ch_ppocr_v2.0/ch_det_mv3_db_v2.0")["Architecture"]["Neck"]["out_channels"] == 96


def test_builtin_config_equals_upstream_det_mv3_db(upstream):
    from_file = load_config(upstream / "PaddleOCR" / "configs" / "det" / "det_mv3_db.yml")
    for section in ("Architecture", "Loss"):
        assert from_file[section] == BUILTIN_DET_MV3_DB[section]


def test_workload_builds_from_builtin_config_without_shared(monkeypatch, tmp_path):
    monkeypatch.setenv("AMPSAFE_SHARED", str(tmp_path / "missing"))
    w = build("dbnet", seed=0, image_size=64, batch_size=2)
    assert w.framework == "paddle" and len(w.model.state_dict()) == 301


@pytest.mark.parametrize(
    "config, words",
    [
        ("no_such_config", "neither a file nor a config name"),
        ({"Architecture": {"Backbone": {"name": "Nope"}}, "Loss": {"name": "DBLoss"}}, "not registered"),
        ({"Loss": {"name": "DBLoss"}}, "no Architecture section"),
        (
            {
                "Architecture": {
                    "Backbone": {"name": "MobileNetV3", "scale": 0.3},
                    "Neck": {"name": "DBFPN", "out_channels": 96},
                    "Head": {"name": "DBHead"},
                },
                "Loss": {"name": "DBLoss"},
            },
            "scale",
        ),
    ],
)
def test_bad_config_raises_config_error_naming_the_problem(config, words):
    with pytest.raises(ConfigError, match=words):
        build("dbnet", config=config, image_size=64, batch_size=1)


def test_registered_neck_is_buildable_by_name():
    class WideDBFPN(DBFPN):
        pass

    register_neck("WideDBFPN_test", WideDBFPN)
    try:
        config = {k: dict(v) if isinstance(v, dict) else v for k, v in BUILTIN_DET_MV3_DB.items()}
        config["Architecture"] = dict(config["Architecture"], Neck={"name": "WideDBFPN_test", "out_channels": 64})
        model = build("dbnet", config=config, image_size=64, batch_size=1).model
        assert type(model.neck) is WideDBFPN and model.neck.out_channels == 64
    finally:
        NECKS.pop("WideDBFPN_test")


def test_register_neck_rejects_a_non_class():
    with pytest.raises(ConfigError):
        register_neck("broken", 42)
