"""The config swap: every upstream config rewritten or refused, nothing else changed, refusals write nothing."""

from __future__ import annotations

import pytest
import yaml
from swap_cases import NO_ARCHITECTURE, REFUSED, REWRITTEN, all_configs

import ampsafe
from ampsafe.patches import swap_neck
from ampsafe.patches.swap import main as swap_main


@pytest.mark.parametrize("rel", all_configs())
def test_every_upstream_config_is_rewritten_or_refused_clearly(upstream, tmp_path, rel):
    out = tmp_path / "out.yml"
    if rel in REWRITTEN:
        written = swap_neck(upstream / rel, out=out)
        assert written == out
        text = out.read_text()
        for name in set(REWRITTEN[rel]):
            assert text.count(name) >= REWRITTEN[rel].count(name)
    else:
        with pytest.raises(ampsafe.ConfigError) as err:
            swap_neck(upstream / rel, out=out)
        assert REFUSED.get(rel, NO_ARCHITECTURE) in str(err.value)
        assert "nothing written" in str(err.value).lower()
        assert list(tmp_path.iterdir()) == []


def test_every_upstream_config_is_in_the_expectation_table(upstream_tree):
    # a new upstream file must be classified; one listed but missing is a stale table
    listed = set(REWRITTEN) | set(REFUSED)
    assert listed <= set(all_configs())


@pytest.mark.parametrize("rel", [r for r in REWRITTEN if r.startswith("PaddleOCR")])
def test_paddleocr_rewrite_changes_only_the_neck_name_lines_and_adds_the_black_list(upstream, tmp_path, rel):
    original = (upstream / rel).read_text().splitlines()
    rewritten = swap_neck(upstream / rel, out=tmp_path / "o.yml").read_text().splitlines()
    # a comment header first: how to run the swapped file (ampsafe run, or import ampsafe.patches)
    header = [i for i, line in enumerate(rewritten[:4]) if line.startswith("# ")]
    assert header == [0, 1, 2, 3] and "ampsafe run -- python tools/train.py" in rewritten[2]
    assert "import ampsafe.patches" in rewritten[3]
    rewritten = rewritten[4:]
    # every rewritten upstream config has a DB head (DBHead / PFHeadLocal) and no black list: one line added
    (added,) = [i for i, line in enumerate(rewritten) if "amp_custom_black_list" in line]
    assert rewritten[added].startswith("  amp_custom_black_list: ['exp']  # ampsafe: ")
    others = rewritten[:added] + rewritten[added + 1 :]
    assert len(original) == len(others)
    changed = [(a, b) for a, b in zip(original, others) if a != b]
    assert len(changed) == len(REWRITTEN[rel])
    for before, after in changed:
        assert before.strip().startswith("name:") and "was " + before.split(":", 1)[1].strip() in after
    # what PaddleOCR's own loader (PyYAML, last duplicate wins, aliases resolved) reads: only names and the list differ
    old, new = yaml.load("\n".join(original), Loader=yaml.Loader), yaml.load("\n".join(rewritten), Loader=yaml.Loader)
    _arch_old, arch_new = old.pop("Architecture"), new.pop("Architecture")
    assert new["Global"].pop("amp_custom_black_list") == ["exp"]
    assert old == new
    necks = [arch_new["Neck"]] if "Neck" in arch_new else [m["Neck"] for m in arch_new["Models"].values()]
    assert [n["name"] for n in necks] == REWRITTEN[rel]


def test_duplicate_keys_keep_pyyaml_semantics_after_rewrite(upstream, tmp_path):
    rel = "PaddleOCR/configs/det/ch_PP-OCRv3/ch_PP-OCRv3_det_cml.yml"  # has a duplicate model_name_pairs
    out = swap_neck(upstream / rel, out=tmp_path / "cml.yml")
    loss = yaml.load(out.read_text(), Loader=yaml.Loader)["Loss"]["loss_config_list"][1]
    assert loss["DistillationDMLLoss"]["model_name_pairs"] == ["Student", "Student2"]  # the last one, as upstream


def test_ppdet_rewrite_is_an_overlay_including_the_original(upstream, tmp_path):
    rel = "PaddleDetection/configs/faster_rcnn/faster_rcnn_r50_fpn_1x_coco.yml"
    out = swap_neck(upstream / rel, out=tmp_path / "sub" / "frcnn_safe.yml")
    data = yaml.safe_load(out.read_text())
    assert data["FasterRCNN"] == {"neck": "AmpSafeFPN"}
    assert data["AmpSafeFPN"] == {"out_channel": 256}
    (base,) = data["_BASE_"]
    assert (out.parent / base).resolve() == (upstream / rel).resolve() or base == str((upstream / rel).resolve())
    assert "backbone" not in data["FasterRCNN"] and "TrainReader" not in data  # not flattened


def test_already_swapped_config_is_refused(upstream, tmp_path):
    first = swap_neck(upstream / "PaddleOCR/configs/det/det_mv3_db.yml", out=tmp_path / "a.yml")
    with pytest.raises(ampsafe.ConfigError, match="already swapped"):
        swap_neck(first, out=tmp_path / "b.yml")
    overlay = swap_neck(
        upstream / "PaddleDetection/configs/faster_rcnn/faster_rcnn_r50_fpn_1x_coco.yml", out=tmp_path / "c.yml"
    )
    with pytest.raises(ampsafe.ConfigError, match="already swapped"):
        swap_neck(overlay, out=tmp_path / "d.yml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.yml", "c.yml"]


def test_island_mode_is_refused_with_the_reason(upstream, tmp_path):
    with pytest.raises(ampsafe.ConfigError, match=r"head's first conv, outside the neck.*ampsafe.patch"):
        swap_neck(upstream / "PaddleOCR/configs/det/det_mv3_db.yml", mode="island", out=tmp_path / "x.yml")
    with pytest.raises(ampsafe.ConfigError, match="rescale"):
        swap_neck(upstream / "PaddleOCR/configs/det/det_mv3_db.yml", mode="rescale", out=tmp_path / "x.yml")
    assert list(tmp_path.iterdir()) == []


def test_non_yaml_and_broken_yaml_are_refused(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("Architecture: {Neck: {name: DBFPN}}")
    with pytest.raises(ampsafe.ConfigError, match="not a YAML file"):
        swap_neck(notes)
    broken = tmp_path / "broken.yml"
    broken.write_text("Architecture: [unclosed\n")
    with pytest.raises(ampsafe.ConfigError, match="not valid YAML"):
        swap_neck(broken)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.yml", "notes.txt"]


def test_refuses_to_overwrite_its_input(upstream, tmp_path):
    src = tmp_path / "det.yml"
    src.write_text((upstream / "PaddleOCR/configs/det/det_mv3_db.yml").read_text())
    with pytest.raises(ampsafe.ConfigError, match="is the input"):
        swap_neck(src, out=src)
    assert "AmpSafe" not in src.read_text()


def test_dict_in_dict_out_leaves_the_input_untouched():
    cfg = {"Global": {"x": 1}, "Architecture": {"Neck": {"name": "LKPAN", "out_channels": 256, "intracl": True}}}
    out = swap_neck(cfg)
    assert out["Architecture"]["Neck"] == {"name": "AmpSafeLKPAN", "out_channels": 256, "intracl": True}
    assert cfg["Architecture"]["Neck"]["name"] == "LKPAN" and out["Global"] == {"x": 1}
    det = swap_neck(
        {"architecture": "FasterRCNN", "FasterRCNN": {"backbone": "ResNet", "neck": "FPN"}, "FPN": {"out_channel": 64}}
    )
    assert det["FasterRCNN"] == {"backbone": "ResNet", "neck": "AmpSafeFPN"} and det["AmpSafeFPN"] == {
        "out_channel": 64
    }
    with pytest.raises(ampsafe.ConfigError, match="no architecture section"):
        swap_neck({"Global": {}})


def test_cli_writes_default_output_and_reports_the_change(upstream, tmp_path, capsys):
    src = tmp_path / "det_mv3_db.yml"
    src.write_text((upstream / "PaddleOCR/configs/det/det_mv3_db.yml").read_text())
    assert swap_main([str(src)]) == 0
    assert "Architecture.Neck: DBFPN -> AmpSafeDBFPN" in capsys.readouterr().out
    assert "name: AmpSafeDBFPN" in (tmp_path / "det_mv3_db_ampsafe.yml").read_text()


def test_cli_refusal_exits_nonzero_with_the_message(upstream, tmp_path, capsys):
    from ampsafe.cli import main as cli_main

    code = cli_main(
        ["swap-neck", str(upstream / "PaddleOCR/configs/det/det_r50_vd_east.yml"), "-o", str(tmp_path / "e.yml")]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "no safe variant for Architecture.Neck.name: EASTFPN" in err
    assert "PaddleOCR's EASTFPN builds every conv as a conv + BatchNorm" in err  # the measured reason
    assert "DBFPN, FCEFPN, FPN_UNet, LKPAN, PRENFPN, RSEFPN, SequenceEncoder, TableFPN" in err
    assert not (tmp_path / "e.yml").exists()


def test_flow_style_and_quoted_names_are_rewritten_in_place(tmp_path):
    src = tmp_path / "flow.yml"
    src.write_text('Architecture:\n  Neck: {name: "RSEFPN", out_channels: 96}  # mine\n  Head: {name: DBHead}\n')
    out = swap_neck(src, out=tmp_path / "o.yml").read_text().split("\n", 4)[4]  # after the how-to-run header
    assert out == 'Architecture:\n  Neck: {name: "AmpSafeRSEFPN", out_channels: 96}  # mine\n  Head: {name: DBHead}\n'
