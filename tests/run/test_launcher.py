"""``ampsafe run`` drives unmodified torch and Paddle scripts with ampsafe's scalers; ``import ampsafe.auto``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from run_helpers import SCRATCH, ampsafe_run, guard_record, only_scaler, stepped_scaler  # tests/run/run_helpers.py

SCRIPTS = Path(__file__).parent / "scripts"


def test_torch_script_gets_ampsafes_scaler_and_summary():
    proc = ampsafe_run("--watch", "--", sys.executable, str(SCRIPTS / "train_torch.py"), "--steps", "6")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "script: scaler is ampsafe.auto.GradScaler" in out
    assert "changed torch.amp.GradScaler -> ampsafe.torch.GradScaler (min_scale=1.0, on_floor='heal')" in out
    assert "[torch, pid" in out and "ampsafe.torch.scaler.GradScaler: 6 steps, 0 skipped, 0 floor hits, 0 heals" in out
    assert "[ampsafe] watching Sequential for NaN/Inf" in proc.stderr  # --watch found the trained model


def test_ppdet_script_builds_the_swapped_neck_by_name(upstream, tmp_path):
    from ampsafe.patches import swap_neck

    overlay = swap_neck(
        upstream / "PaddleDetection/configs/faster_rcnn/faster_rcnn_r50_fpn_1x_coco.yml", out=tmp_path / "f.yml"
    )
    proc = ampsafe_run("--", sys.executable, str(SCRIPTS / "build_ppdet.py"), "-c", str(overlay))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "script: built AmpSafeFPN as ampsafe.paddle.nets.ppdet_necks.AmpSafeFPN" in proc.stdout
    assert "changed ppdet necks registered: AmpSafeFPN" in proc.stdout


def test_floor_option_reaches_the_scaler_clamp_finishes_raise_stops(tmp_path):
    poisoned = ["--", sys.executable, str(SCRIPTS / "train_torch.py"), "--poison", "--init-scale", "8", "--steps", "6"]
    clamp = ampsafe_run("--on-floor", "clamp", "--report", str(tmp_path / "clamp"), *poisoned)
    assert clamp.returncode == 0, clamp.stderr
    scaler = stepped_scaler(tmp_path / "clamp")  # 8 -> 4 -> 2 -> 1, then three steps at the floor
    assert (scaler.on_floor, scaler.total_steps, scaler.skipped_steps, scaler.floor_hits) == ("clamp", 6, 6, 3), scaler
    raised = ampsafe_run("--on-floor", "raise", "--report", str(tmp_path / "raise"), *poisoned)  # heal: the default
    assert raised.returncode == 1
    assert "LossScaleFloorError" in raised.stderr
    assert "the command exited with status 1" in raised.stdout
    scaler = only_scaler(tmp_path / "raise")  # stopped at its first floor hit
    assert (scaler.on_floor, scaler.floor_hits, scaler.heals) == ("raise", 1, 0), scaler


def test_paddle_script_reads_ampsafe_section_of_its_config(tmp_path):
    config = tmp_path / "train.yml"
    config.write_text("Global:\n  init_loss_scaling: 512\nampsafe:\n  on_floor: clamp\n  min_scale: 4\n")
    script = [sys.executable, str(SCRIPTS / "train_paddle.py"), "-c", str(config), "--steps", "4"]
    # on a CPU the scaler scales only with float16 emulated
    proc = ampsafe_run("--emulate-fp16", "--report", str(tmp_path / "report"), "--", *script)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"min_scale=4.0, on_floor='clamp' (ampsafe: section of {config})" in out
    assert "changed paddle.amp.GradScaler -> ampsafe.paddle.GradScaler (min_loss_scaling=4.0, on_floor='clamp')" in out
    scaler = stepped_scaler(tmp_path / "report")
    assert (scaler.framework, scaler.class_name, scaler.total_steps) == (
        "paddle",
        "ampsafe.paddle.scaler.GradScaler",
        4,
    )
    assert (scaler.on_floor, scaler.scale) == ("clamp", 512.0), scaler  # the script's own init_loss_scaling was kept


def test_paddle_script_on_a_cpu_without_emulation_is_fp32_and_guarded(tmp_path):
    """Without --emulate-fp16 the scaler disables itself on a CPU as Paddle's does: the summary says why and the
    FP32 guard takes the steps."""
    proc = ampsafe_run(
        "--report", str(tmp_path), "--", sys.executable, str(SCRIPTS / "train_paddle.py"), "--steps", "4"
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    # the summary line a user reads says why the scaler is off and where its steps went
    assert "ampsafe.paddle.scaler.GradScaler: disabled (CPU place: Paddle's AMP is off on a CPU" in out
    assert "(its optimizer steps went through the FP32 guard)" in out
    scaler = only_scaler(tmp_path)
    assert scaler.disabled_reason.startswith("disabled (CPU place") and not scaler.total_steps, scaler
    guard = guard_record(tmp_path)
    assert (guard.model, guard.total_steps, guard.skipped_at) == ("Sequential", 4, ()), guard
    assert "AmpScaler can only be enabled on CUDAPlace, XPUPlace and CustomPlace" in proc.stderr


def test_disabled_paddle_scaler_on_a_cpu_leaves_its_nan_step_to_the_fp32_guard():
    code = (
        "import ampsafe.auto as auto\n"
        "import paddle\n"
        "paddle.seed(0)\n"
        "model = paddle.nn.Linear(4, 1)\n"
        "opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())\n"
        "scaler = paddle.amp.GradScaler(init_loss_scaling=1024.0)\n"
        "assert not scaler.is_enable() and scaler.disabled_reason.startswith('disabled (CPU place')\n"
        "for step, scale in enumerate([1.0, float('nan'), 1.0, 1.0]):\n"
        "    loss = model(paddle.ones([2, 4]) * scale).mean()\n"
        "    scaled = scaler.scale(loss)\n"
        "    assert scaled is loss\n"
        "    scaled.backward()\n"
        "    scaler.minimize(opt, scaled) if step % 2 else (scaler.step(opt), scaler.update())\n"
        "    opt.clear_grad()\n"
        "    assert paddle.isfinite(model.weight).all()\n"
        "from ampsafe.run.session import current\n"
        "(guard,) = [g for g in current().guards if g.backend.name == 'paddle']\n"
        "assert (guard.total_steps, guard.skipped_at, guard.scaler_steps) == (4, [1], 0), guard.to_dict()\n"
        "assert auto.summary()['scalers'][0]['disabled_reason'].startswith('disabled (CPU place')\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=SCRATCH)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


def test_command_line_beats_config_and_bad_options_are_refused(tmp_path, capsys):
    import ampsafe
    from ampsafe.run.launcher import _parser, _resolve, main

    config = tmp_path / "train.yml"
    config.write_text("ampsafe:\n  on_floor: clamp\n  min_scale: 8\n")
    args = _parser().parse_args(["--min-scale", "2", "--", "python", "train.py", "-c", str(config)])
    options, source = _resolve(args, args.command[1:])
    assert options.min_scale == 2.0 and options.on_floor == "clamp" and str(config) in source
    config.write_text("ampsafe:\n  on_floor: clamp\n  speed: 11\n")
    with pytest.raises(ampsafe.ConfigError, match=r"unknown keys in `ampsafe:` \['speed'\]"):
        main(["--", sys.executable, "train.py", "-c", str(config)])
    with pytest.raises(ampsafe.ConfigError, match="min_scale must be >= 0"):
        main(["--min-scale", "-1", "--", sys.executable, "-c", "pass"])
    with pytest.raises(ampsafe.ConfigError, match="needs a command"):
        main([])
    assert main(["--", "true"]) == 0  # not Python: nothing loaded ampsafe, and the summary says so
    assert "no Python process of the command loaded ampsafe" in capsys.readouterr().out
    assert main(["--", "false"]) == 1  # the command's exit status is passed through


def test_import_ampsafe_auto_patches_in_process_and_uninstalls():
    code = (
        "import torch, ampsafe.auto as auto\n"
        "from ampsafe.torch.scaler import GradScaler as Safe\n"
        "s = torch.amp.GradScaler('cpu', min_scale=2.0)\n"
        "assert isinstance(s, Safe) and s.policy.min_scale == 2.0 and s.policy.on_floor == 'heal'\n"
        "assert auto.summary()['scalers'][0]['class'] == 'ampsafe.torch.scaler.GradScaler'\n"
        "c = torch.cuda.amp.GradScaler(init_scale=4.0, enabled=False)\n"
        "assert isinstance(c, Safe) and auto.summary()['scalers'][1]['class'] == 'ampsafe.torch.scaler.GradScaler'\n"
        "auto.uninstall()\n"
        "assert not isinstance(torch.amp.GradScaler('cpu'), Safe)\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


@pytest.mark.parametrize("value", ["sometimes", "x"])
def test_install_rejects_bad_on_floor(value):
    import ampsafe
    from ampsafe.run.options import RunOptions

    with pytest.raises(ampsafe.ConfigError, match="on_floor must be one of"):
        RunOptions(on_floor=value)


def test_the_config_is_read_from_the_scripts_arguments_never_from_python_dash_c(capsys):
    from pathlib import Path

    from ampsafe.run.launcher import _config_path, main

    code = "pass  # " + "x" * 300  # longer than a file name may be: it must never be taken for a config path
    assert _config_path([sys.executable, "-c", code]) is None
    assert _config_path([sys.executable, "-u", "train.py", "-c", "det.yml"]) == Path("det.yml")
    assert _config_path(["python3", "-m", "tools.train", "--config=det.yml"]) == Path("det.yml")
    assert _config_path(["bash", "-c", "det.yml"]) == Path("det.yml")  # not Python: its own arguments
    assert main(["--report", "", "--", sys.executable, "-c", code]) == 0


def test_a_child_killed_by_a_signal_after_loading_ampsafe_is_reported_as_such(tmp_path):
    script = tmp_path / "segfault.py"
    script.write_text("import os, signal\nimport ampsafe  # noqa: F401\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    proc = ampsafe_run("--report", str(tmp_path / "report"), "--", sys.executable, str(script))
    assert proc.returncode == 128 + 11, proc.stderr[-2000:]  # a shell's status for SIGSEGV
    assert "ampsafe run: the command died on signal 11 after ampsafe loaded (SIGSEGV)" in proc.stdout
    assert "no Python process of the command loaded ampsafe" not in proc.stdout
    assert "no process of the command wrote its summary" in proc.stdout


def test_a_sigterm_to_ampsafe_run_alone_ends_the_command_and_the_runs_folder(tmp_path):
    """``kill`` of the launcher's pid (a scheduler stopping the job): without ampsafe that signal ends the training;
    under ``ampsafe run`` it goes on to the command, whose death is named, and the run's temporary folder goes."""
    pid_file, tmp = tmp_path / "child.pid", tmp_path / "tmp"
    tmp.mkdir()
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "ampsafe.cli", "run", "--", sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=SCRATCH,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    deadline = time.monotonic() + 120
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(pid_file.read_text())
    launcher.send_signal(signal.SIGTERM)
    out, _ = launcher.communicate(timeout=120)
    assert launcher.returncode == 128 + signal.SIGTERM, out
    assert "the command died on signal 15 after ampsafe loaded (SIGTERM)" in out
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
    assert list(tmp.iterdir()) == []
