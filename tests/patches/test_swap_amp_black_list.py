"""The config swap keeps a DB head's step-function exp in float32 at AMP O2: ``Global.amp_custom_black_list`` gets
``exp`` (absent: one line added; a list without it: the item added; listed: left), every other byte unchanged."""

from __future__ import annotations

import pytest
import yaml

import ampsafe
from ampsafe.patches import swap_neck
from ampsafe.patches.swap import _swap_file
from ampsafe.patches.swap import main as swap_main

DET = "PaddleOCR/configs/det/det_mv3_db.yml"
REASON = "DBHead's step-function exp overflows float16 at O2"
ADDED = f"  amp_custom_black_list: ['exp']  # ampsafe: {REASON}\n"
NECK_OLD = "    name: DBFPN\n"
NECK_NEW = "    name: AmpSafeDBFPN  # ampsafe swap-neck (convbn): was DBFPN\n"
LAST_GLOBAL = "  save_res_path: ./output/det_db/predicts_db.txt\n"  # det_mv3_db.yml's last Global key


@pytest.fixture
def det_text(upstream) -> str:
    text = (upstream / DET).read_text(encoding="utf-8")
    assert text.count(NECK_OLD) == 1 and text.count(LAST_GLOBAL) == 1 and "amp_custom_black_list" not in text
    return text


def _body(text: str) -> str:
    """The swapped file after its how-to-run header (four comment lines, checked in test_swap)."""
    lines = text.splitlines(keepends=True)
    assert lines[0].startswith("# Written by `ampsafe swap-neck") and all(x.startswith("# ") for x in lines[:4])
    return "".join(lines[4:])


def _swap(tmp_path, text: str, name: str = "det.yml"):
    src = tmp_path / name
    src.write_text(text, encoding="utf-8")
    out, changes = _swap_file(src, "convbn", tmp_path / f"out_{name}")
    return _body(out.read_text(encoding="utf-8")), changes


def _paddleocr_load(text: str):
    return yaml.load(text, Loader=yaml.Loader)  # PaddleOCR's loader


def _with_black_list(text: str, entry: str) -> str:
    """det_mv3_db.yml with ``entry`` (lines) as Global's last key."""
    return text.replace(LAST_GLOBAL, LAST_GLOBAL + entry)


def test_upstream_det_mv3_db_gets_exp_on_one_added_line_and_nothing_else(upstream, tmp_path, det_text):
    out = swap_neck(upstream / DET, out=tmp_path / "det.yml")
    text = _body(out.read_text(encoding="utf-8"))
    cfg = _paddleocr_load(text)
    assert cfg["Global"]["amp_custom_black_list"] == ["exp"]
    assert cfg["Architecture"]["Neck"]["name"] == "AmpSafeDBFPN"
    # byte for byte: the original with the neck line replaced and one line after Global's last key
    assert text == det_text.replace(NECK_OLD, NECK_NEW).replace(LAST_GLOBAL, LAST_GLOBAL + ADDED)
    original, rewritten = det_text.splitlines(keepends=True), text.splitlines(keepends=True)
    rewritten.remove(ADDED)
    assert [(a, b) for a, b in zip(original, rewritten) if a != b] == [(NECK_OLD, NECK_NEW)]
    assert len(original) == len(rewritten)
    old = _paddleocr_load(det_text)
    old["Global"]["amp_custom_black_list"] = ["exp"]
    old["Architecture"]["Neck"]["name"] = "AmpSafeDBFPN"
    assert cfg == old


def test_cli_prints_the_black_list_change(upstream, tmp_path, capsys):
    out = tmp_path / "o.yml"
    assert swap_main([str(upstream / DET), "-o", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "Architecture.Neck: DBFPN -> AmpSafeDBFPN",
        f"Global.amp_custom_black_list: + exp ({REASON})",
        f"wrote {out}",
    ]


def test_black_list_already_listing_exp_is_left_alone(tmp_path, det_text, capsys):
    for i, entry in enumerate(
        ["  amp_custom_black_list: [matmul, exp]\n", "  amp_custom_black_list:\n    - exp\n    - matmul\n"]
    ):
        src = _with_black_list(det_text, entry)
        text, changes = _swap(tmp_path, src, f"det{i}.yml")
        assert text == src.replace(NECK_OLD, NECK_NEW)
        assert changes == [("Architecture.Neck", "DBFPN -> AmpSafeDBFPN")]
    assert swap_main([str(tmp_path / "det0.yml"), "-o", str(tmp_path / "cli.yml")]) == 0
    assert "amp_custom_black_list" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("entry", "edited", "listed"),
    [
        (  # PaddleOCR's own style (configs/table/table_mv3.yml)
            "  amp_custom_black_list: ['matmul_v2','elementwise_add']\n",
            f"  amp_custom_black_list: ['matmul_v2','elementwise_add','exp']  # ampsafe: {REASON}\n",
            ["matmul_v2", "elementwise_add", "exp"],
        ),
        (  # a comment of the user's is kept, none added
            "  amp_custom_black_list: [matmul]  # mine\n",
            "  amp_custom_black_list: [matmul, exp]  # mine\n",
            ["matmul", "exp"],
        ),
        ("  amp_custom_black_list: []\n", f"  amp_custom_black_list: [exp]  # ampsafe: {REASON}\n", ["exp"]),
    ],
)
def test_flow_black_list_without_exp_gets_it_before_the_bracket(tmp_path, det_text, entry, edited, listed):
    text, changes = _swap(tmp_path, _with_black_list(det_text, entry))
    assert text == _with_black_list(det_text, edited).replace(NECK_OLD, NECK_NEW)
    assert _paddleocr_load(text)["Global"]["amp_custom_black_list"] == listed
    assert changes[-1] == ("Global.amp_custom_black_list", f"+ exp ({REASON})")


@pytest.mark.parametrize("indent", ["  ", "    "])
def test_block_black_list_without_exp_gets_a_dash_line_after_its_last_item(tmp_path, det_text, indent):
    entry = f"  amp_custom_black_list:\n{indent}- matmul\n{indent}- 'elementwise_add'  # mine\n"
    text, changes = _swap(tmp_path, _with_black_list(det_text, entry))
    expected = _with_black_list(det_text, entry + f"{indent}- exp  # ampsafe: {REASON}\n")
    assert text == expected.replace(NECK_OLD, NECK_NEW)
    assert _paddleocr_load(text)["Global"]["amp_custom_black_list"] == ["matmul", "elementwise_add", "exp"]
    assert changes[-1] == ("Global.amp_custom_black_list", f"+ exp ({REASON})")


@pytest.mark.parametrize(
    "entry",
    [
        "  amp_custom_black_list: exp\n",  # not a list
        "  amp_custom_black_list:\n",  # null
        "  amp_custom_black_list: [matmul,\n    elementwise_add]\n",  # flow list over two lines
        "  amp_custom_black_list: [exp]\n  amp_custom_black_list: [matmul]\n",  # PyYAML reads the last: no exp
    ],
)
def test_black_list_that_cannot_take_exp_in_place_is_refused_with_what_to_add(tmp_path, det_text, entry):
    src = tmp_path / "det.yml"
    src.write_text(_with_black_list(det_text, entry), encoding="utf-8")
    with pytest.raises(ampsafe.ConfigError) as err:
        swap_neck(src, out=tmp_path / "o.yml")
    message = str(err.value)
    assert "add it by hand" in message and "amp_custom_black_list: [..., exp]" in message and REASON in message
    assert "nothing written" in message
    assert [p.name for p in tmp_path.iterdir()] == ["det.yml"]


def test_non_db_head_gets_no_black_list(upstream, tmp_path, det_text):
    text, changes = _swap(tmp_path, det_text.replace("    name: DBHead\n", "    name: PSEHead\n"))
    assert "amp_custom_black_list" not in text and changes == [("Architecture.Neck", "DBFPN -> AmpSafeDBFPN")]
    # PaddleDetection: unchanged, the overlay names the neck only
    out, changes = _swap_file(
        upstream / "PaddleDetection/configs/faster_rcnn/faster_rcnn_r50_fpn_1x_coco.yml", "convbn", tmp_path / "d.yml"
    )
    assert "amp_custom_black_list" not in out.read_text() and changes == [("FasterRCNN.neck", "FPN -> AmpSafeFPN")]


def test_pfheadlocal_and_distillation_heads_get_exp_once(upstream, tmp_path):
    # PFHeadLocal subclasses DBHead and calls its step_function (ppocr/modeling/heads/det_db_head.py)
    teacher = swap_neck(upstream / "PaddleOCR/configs/det/ch_PP-OCRv4/ch_PP-OCRv4_det_teacher.yml", out=tmp_path / "t")
    text = teacher.read_text()
    assert "amp_custom_black_list: ['exp']  # ampsafe: PFHeadLocal's step-function exp" in text
    # three DBHeads under Architecture.Models: one entry
    cml = swap_neck(upstream / "PaddleOCR/configs/det/ch_PP-OCRv3/ch_PP-OCRv3_det_cml.yml", out=tmp_path / "c.yml")
    text = cml.read_text()
    assert text.count("amp_custom_black_list") == 1
    assert _paddleocr_load(text)["Global"]["amp_custom_black_list"] == ["exp"]


def test_config_without_global_gets_nothing_and_the_change_lines_say_so(tmp_path, det_text, capsys):
    src = det_text[det_text.index("Architecture:") :]
    text, changes = _swap(tmp_path, src)
    assert text == src.replace(NECK_OLD, NECK_NEW)
    where, what = changes[-1]
    assert where == "Global.amp_custom_black_list" and what.startswith("not added, the config has no Global section")
    assert "amp_custom_black_list: ['exp']" in what and REASON in what
    assert swap_main([str(tmp_path / "det.yml"), "-o", str(tmp_path / "cli.yml")]) == 0
    assert "Global.amp_custom_black_list: not added" in capsys.readouterr().out


def test_dict_path_does_the_same_on_the_copy():
    def cfg(**glob):
        return {"Global": glob, "Architecture": {"Neck": {"name": "DBFPN"}, "Head": {"name": "DBHead", "k": 50}}}

    original = cfg(epoch_num=1)
    out = swap_neck(original)
    assert out["Global"] == {"epoch_num": 1, "amp_custom_black_list": ["exp"]}
    assert out["Architecture"]["Neck"]["name"] == "AmpSafeDBFPN"
    assert original == cfg(epoch_num=1)  # the input untouched
    with_list = cfg(amp_custom_black_list=["matmul"])
    assert swap_neck(with_list)["Global"]["amp_custom_black_list"] == ["matmul", "exp"]
    assert with_list["Global"]["amp_custom_black_list"] == ["matmul"]
    assert swap_neck(cfg(amp_custom_black_list=["exp"]))["Global"]["amp_custom_black_list"] == ["exp"]
    with pytest.raises(ampsafe.ConfigError, match="make it a list that contains exp"):
        swap_neck(cfg(amp_custom_black_list="exp"))
    non_db = {"Global": {}, "Architecture": {"Neck": {"name": "DBFPN"}, "Head": {"name": "PSEHead"}}}
    assert swap_neck(non_db)["Global"] == {}
    with pytest.warns(UserWarning, match="no Global section"):
        out = swap_neck({"Architecture": {"Neck": {"name": "DBFPN"}, "Head": {"name": "DBHead"}}})
    assert "Global" not in out and out["Architecture"]["Neck"]["name"] == "AmpSafeDBFPN"
