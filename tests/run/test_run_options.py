"""``RunOptions``: one typed value for ``ampsafe run``'s options, validated once, the same in parent and child."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from ampsafe import ConfigError
from ampsafe.run.options import ENV_OPTIONS, RunOptions


def test_options_round_trip_through_the_child_environment():
    options = RunOptions(on_floor="clamp", min_scale=4, watch=True, max_skips=3, report="out", emulate_fp16=True)
    back = RunOptions.from_env({ENV_OPTIONS: options.to_env()})
    assert back == options and back.min_scale == 4.0 and isinstance(back.min_scale, float)
    assert RunOptions.from_env({}) == RunOptions(report=None)  # import ampsafe.auto outside ampsafe run


def test_each_framework_gets_the_floor_in_its_own_words():
    from ampsafe._framework import backend_named

    options = RunOptions(min_scale=2.0, on_floor="raise")
    torch_args, paddle_args = (backend_named(name).amp.scaler_args for name in ("torch", "paddle"))
    assert options.scaler_kwargs(torch_args) == {"min_scale": 2.0, "on_floor": "raise"}
    assert options.scaler_kwargs(paddle_args) == {"min_loss_scaling": 2.0, "on_floor": "raise"}
    assert options.scaler_text(paddle_args) == "min_loss_scaling=2.0, on_floor='raise'"
    assert options.scaler_text() == "min_scale=2.0, on_floor='raise'"  # the options' own names


def test_metrics_flags_reach_the_options():
    from ampsafe.run.launcher import _parser

    assert (RunOptions().metrics, RunOptions().tensorboard) == (True, None)  # on for trainers, no event file
    args = _parser().parse_args(["--no-metrics", "--", "python", "train.py"])
    assert RunOptions.from_cli(args).metrics is False
    args = _parser().parse_args(["--tensorboard", "runs/amp", "--", "python", "train.py"])
    options = RunOptions.from_cli(args, {"metrics": True})
    assert (options.metrics, options.tensorboard) == (True, "runs/amp")
    assert RunOptions.from_env({ENV_OPTIONS: options.to_env()}) == options


def test_command_line_over_config_over_defaults():
    args = argparse.Namespace(on_floor=None, min_scale=2.0, watch=None, max_skips=None, report=None, quiet=False)
    options = RunOptions.from_cli(args, {"on_floor": "clamp", "min-scale": 8, "max_skips": 4})
    assert (options.on_floor, options.min_scale, options.max_skips, options.report) == ("clamp", 2.0, 4, "ampsafe-run")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"min_scale": -1}, "min_scale must be >= 0"),
        ({"min_scale": "big"}, "min_scale must be a number"),
        ({"max_skips": 1.5}, "max_skips must be an int"),
        ({"on_bad_target": "fix"}, "on_bad_target must be one of raise, drop"),
        ({"watch": "yes"}, "watch must be true or false"),
        ({"speed": 11}, r"unknown option\(s\) \['speed'\]"),
        ({"metrics": "off"}, "metrics must be true or false"),
        ({"tensorboard": 3}, "tensorboard must be a folder path or None"),
        ({"metrics": False, "tensorboard": "tb"}, "metrics=False .--no-metrics. turns them off"),
    ],
)
def test_bad_values_are_refused_naming_the_option(values, message):
    with pytest.raises(ConfigError, match=message):
        RunOptions.from_mapping(values)
    with pytest.raises(ConfigError, match=ENV_OPTIONS):
        RunOptions.from_env({ENV_OPTIONS: "{not json"})


def test_install_after_import_applies_the_new_options():
    code = (
        "import torch, ampsafe.auto as auto\n"
        "options = auto.install(on_floor='raise', min_scale=4.0)\n"
        "assert (options.on_floor, options.min_scale) == ('raise', 4.0), options\n"
        "s = torch.amp.GradScaler('cpu')\n"
        "assert (s.policy.on_floor, s.policy.min_scale) == ('raise', 4.0), s.policy\n"
        "try:\n"
        "    auto.install(on_floor='sometimes')\n"
        "except auto.ConfigError if hasattr(auto, 'ConfigError') else Exception as exc:\n"
        "    assert 'on_floor must be one of' in str(exc)\n"
        "assert auto.summary()['options']['on_floor'] == 'raise'\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_tensorboard_without_its_package_is_refused_before_the_command_runs(tmp_path):
    code = (
        "import sys\n"
        "sys.modules['tensorboard'] = sys.modules['tensorboardX'] = None  # neither installed\n"
        "from ampsafe.cli import main\n"
        "sys.exit(main(['run', '--tensorboard', 'tb', '--', sys.executable, '-c', 'open(\"ran\", \"w\")']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1 and "pip install 'ampsafe[tensorboard]'" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "ran").exists()
