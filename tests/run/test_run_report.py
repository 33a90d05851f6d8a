"""``ampsafe run`` heals an unmodified float16 script by default and writes the report that makes the fix permanent."""

from __future__ import annotations

import json
import sys

import pytest
from run_helpers import SCRIPTS, ampsafe_run  # tests/run/run_helpers.py

# a run whose scaler overflowed float16 (backed off 4 times, no floor): a neck swap is advice for it
OVERFLOWED = {
    "pid": 1,
    "scalers": [
        {
            "class": "ampsafe.torch.scaler.GradScaler",
            "framework": "torch",
            "total_steps": 8,
            "overflow_steps": 4,
            "skipped_steps": 4,
            "steps": [[i, 2.0 ** (16 - min(i, 4)), i < 4, False] for i in range(8)],
        }
    ],
}


def test_forward_overflow_heals_once_by_default_and_the_report_gives_the_patch_line(tmp_path):
    report = tmp_path / "report"
    proc = ampsafe_run("--report", str(report), "--", sys.executable, str(SCRIPTS / "train_fp16_overflow.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "script: done" in proc.stdout
    assert f"report {report / 'report.md'}" in proc.stdout  # the summary points at the report
    data = json.loads((report / "report.json").read_text())
    (scaler,) = data["scalers"]
    (heal,) = scaler["heal_records"]
    assert scaler["heals"] == 1, scaler  # healed once
    assert "embed" in heal["paths"]  # the unnormalized Linear
    overflowing = [step for step, _scale, found_inf, _floor in scaler["steps"] if found_inf]
    assert overflowing and max(overflowing) <= heal["step"]  # no overflow after the heal
    patch = 'ampsafe.patch(model, policy="island", paths=' + json.dumps(heal["paths"]) + ")"
    assert data["fix"]["patch"] == patch
    markdown = (report / "report.md").read_text()
    assert patch in markdown and "![loss scale](scale.png)" in markdown
    assert (report / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_forward_overflow_with_on_floor_raise_names_the_forward_and_the_linear(tmp_path):
    proc = ampsafe_run(
        "--on-floor", "raise", "--report", str(tmp_path), "--", sys.executable, str(SCRIPTS / "train_fp16_overflow.py")
    )
    assert proc.returncode != 0
    error = next(line for line in proc.stderr.splitlines() if line.startswith("ampsafe.errors.LossScaleFloorError"))
    assert "forward" in error and "embed:linear" in error


def test_a_clean_run_offers_no_neck_swap_and_its_exit_line_agrees_with_the_report(upstream, tmp_path):
    # the config's neck has a safe counterpart, but nothing overflowed: the exit line and report.md both say
    # "nothing to change" (the exit line used to suggest swap-neck while report.md said "Nothing to change")
    config = upstream / "PaddleDetection/configs/faster_rcnn/faster_rcnn_r50_fpn_1x_coco.yml"
    proc = ampsafe_run(
        "--report", str(tmp_path), "--", sys.executable, str(SCRIPTS / "build_ppdet.py"), "-c", str(config)
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    markdown = (tmp_path / "report.md").read_text()
    assert "swap-neck" not in markdown and "swap-neck" not in proc.stdout
    assert "Nothing to change" in markdown and ": nothing to change" in proc.stdout
    assert json.loads((tmp_path / "report.json").read_text())["fix"]["swap_neck"] is None


def test_an_overflowing_run_gives_the_swap_neck_command_for_the_configs_neck(upstream):
    from ampsafe.run.report import permanent_fix, to_markdown

    config = upstream / "PaddleDetection/configs/faster_rcnn/faster_rcnn_r50_fpn_1x_coco.yml"
    command = ["python", "tools/train.py", "-c", str(config)]
    fix = permanent_fix(OVERFLOWED, config=config, command=command)
    markdown = to_markdown(OVERFLOWED, fix, command=command, plot=None)
    out = config.with_name("faster_rcnn_r50_fpn_1x_coco_ampsafe.yml")
    assert f"ampsafe swap-neck {config} -o {out}" in markdown
    assert f"-c {out}" in markdown  # the same command, run on the swapped config
    assert not out.exists()  # the report suggests the command; it writes no config
    assert fix.to_dict()["swap_neck"]["applicable"] is True


def test_report_of_a_clean_fp32_run_says_nothing_to_change(tmp_path):
    proc = ampsafe_run(
        "--report", str(tmp_path), "--", sys.executable, str(SCRIPTS / "train_fp32_nan.py"), "--nan-step", "-1"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "nothing to change" in proc.stdout
    assert "Nothing to change" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "scale.png").is_file()


def test_paddle_heals_give_the_island_patch_for_O1_and_after_decorate_for_O2():
    pytest.importorskip("paddle")
    from ampsafe._framework import backend_named
    from ampsafe.run.report import permanent_fix, to_markdown

    # the summary records the levels whose island line differs, as Paddle's backend states them
    island_levels = {level: list(words) for level, words in backend_named("paddle").amp.island_levels.items()}
    report = {
        "pid": 1,
        "scalers": [
            {
                "class": "ampsafe.paddle.scaler.GradScaler",
                "framework": "paddle",
                "island_levels": island_levels,
                "total_steps": 30,
                "overflow_steps": 4,
                "skipped_steps": 4,
                "floor_hits": 2,
                "heals": 2,
                "heal_records": [
                    {"step": 9, "paths": ["neck.in2_conv", "head.binarize.conv1"]},
                    {"step": 20, "paths": ["backbone.stages.0.conv", "neck.in2_conv"]},
                ],
            }
        ],
    }
    fix = permanent_fix(report)
    paths = ["neck.in2_conv", "head.binarize.conv1", "backbone.stages.0.conv"]
    assert fix.patch == f'ampsafe.patch(model, policy="island", paths={json.dumps(paths)})'
    # O2: the islands' compute in float32 (decorate's excluded_layers keeps only their parameters)
    assert (
        fix.level_lines["paddle_o2"] == f'ampsafe.patch(model, policy="island", level="O2", paths={json.dumps(paths)})'
    )
    markdown = to_markdown(report, fix)
    assert fix.patch in markdown and fix.level_lines["paddle_o2"] in markdown and "level='O2'" in markdown
    assert "excluded_layers" not in fix.level_lines["paddle_o2"] and "Nothing to change" not in markdown


def test_next_run_line_keeps_the_run_options_and_is_shell_quoted(upstream, tmp_path):
    from ampsafe.run.report import permanent_fix, to_markdown

    config = upstream / "PaddleDetection/configs/faster_rcnn/faster_rcnn_r50_fpn_1x_coco.yml"
    command = ["python", "tools/train.py", "-c", str(config), "-o", "weights=my dir/model.pdparams"]
    fix = permanent_fix(OVERFLOWED, config=config, command=command, run_args=["--emulate-fp16"])
    out = config.with_name("faster_rcnn_r50_fpn_1x_coco_ampsafe.yml")
    assert fix.swap_neck.run == (
        f"ampsafe run --emulate-fp16 -- python tools/train.py -c {out} -o 'weights=my dir/model.pdparams'"
    )
    assert "Command: `python tools/train.py -c" in to_markdown({"scalers": []}, fix, command=command, plot=None)
    assert "'weights=my dir/model.pdparams'`" in to_markdown({"scalers": []}, fix, command=command, plot=None)
