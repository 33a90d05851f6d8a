"""``ampsafe run`` with ZERO edits to the script: the ``amp/*`` metrics reach the logger the script already feeds
(HF ``Trainer``'s TensorBoard, Lightning's ``TensorBoardLogger``, mmengine's ``TensorboardVisBackend``,
ultralytics' ``results.csv``), and a plain loop's ``--tensorboard DIR``. Each test reads them back from the
logger's own output and compares them with the scaler's own figures in the run's ``report.json`` (per step: the
scale each step ran with, which overflowed, floor hits, heals), not with anything the integration computed.

The scripts (``scripts/zero_edit_*.py``, ``scripts/plain_loop.py``) import nothing of ampsafe.
"""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest
from amp_logs import NAMES, SCRIPTS, figures_after, final_figures, report_scaler, scalars

pytestmark = pytest.mark.slow  # each test runs a trainer under ampsafe run in a subprocess


COUNTED = {f"amp/{name}" for name in NAMES}  # the scaler's own figures (amp_logs.NAMES)
HEALING = ("--emulate-fp16", "--min-scale", "2048")  # a floor the overflow reaches within a few steps: a heal


def _run(tmp_path, script: str, *script_args: str, run_args=("--emulate-fp16",)) -> tuple[str, dict]:
    """``ampsafe run RUN_ARGS --report rep -- python scripts/SCRIPT ARGS`` (which must exit 0): its output and the
    report.json record of the scaler that stepped."""
    command = [sys.executable, "-m", "ampsafe.cli", "run", *run_args, "--report", str(tmp_path / "rep")]
    command += ["--", sys.executable, str(SCRIPTS / script), *script_args]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr, report_scaler(tmp_path / "rep")


def by_step(series: dict, prefix: str = "") -> dict[int, dict[str, float]]:
    """step -> {amp/name: value} of the ``prefix + amp/*`` tags of the figures the scaler itself counts (the last
    value written at a step); other ``amp/*`` keys have no per-step record in report.json to compare with."""
    out: dict[int, dict[str, float]] = {}
    for tag, values in series.items():
        if tag[len(prefix) :] in COUNTED and tag.startswith(prefix):
            for step, value in values:
                out.setdefault(step, {})[tag[len(prefix) :]] = value
    return out


@pytest.mark.parametrize(
    ("script", "framework"), [("plain_loop.py", "torch"), ("plain_loop_paddle.py", "paddle")], ids=["torch", "paddle"]
)
def test_plain_loop_tensorboard_dir_holds_the_scaler_s_figures_after_every_step(tmp_path, script, framework):
    pytest.importorskip("tensorboard")
    pytest.importorskip(framework)
    steps = 8
    run_args = ("--emulate-fp16", "--tensorboard", "tb")
    out, record = _run(tmp_path, script, "--steps", str(steps), run_args=run_args)
    logged = by_step(scalars(tmp_path / "tb"))
    assert sorted(logged) == list(range(1, steps + 1))  # one write per optimizer step, at the steps taken so far
    assert logged == {n: figures_after(record, n) for n in range(1, steps + 1)}
    assert logged[steps] == final_figures(record) and record["skipped_steps"] >= 1  # backed off from 2**24, then clean


def test_no_metrics_refuses_a_tensorboard_dir(tmp_path):
    command = [sys.executable, "-m", "ampsafe.cli", "run", "--no-metrics", "--tensorboard", "tb", "--"]
    proc = subprocess.run([*command, sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "--no-metrics" in proc.stderr and "tensorboard" in proc.stderr, proc.stderr


def test_hf_trainer_tensorboard_gets_the_scaler_s_figures_at_every_log(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("tensorboard")
    steps = 12
    args = ("--out", str(tmp_path / "out"), "--steps", str(steps))
    out, record = _run(tmp_path, "zero_edit_hf.py", *args, run_args=HEALING)
    assert "amp/* metrics added to HF Trainer's loggers (AmpCallback, ahead of the report_to callbacks)" in out
    logged = by_step(scalars(tmp_path / "out"), prefix="train/")  # HF's loggers prefix training keys train/
    assert sorted(logged)[:steps] == list(range(1, steps + 1))
    assert {n: logged[n] for n in range(1, steps + 1)} == {n: figures_after(record, n) for n in range(1, steps + 1)}
    assert logged[steps] == final_figures(record) and record["heals"] >= 1 and record["skipped_steps"] >= 2


def test_no_metrics_leaves_the_hf_trainer_s_logs_as_they_were(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("tensorboard")
    args = ("--out", str(tmp_path / "out"), "--steps", "2")
    out, record = _run(tmp_path, "zero_edit_hf.py", *args, run_args=("--emulate-fp16", "--no-metrics"))
    series = scalars(tmp_path / "out")
    assert "train/loss" in series and not [tag for tag in series if "amp/" in tag], sorted(series)
    assert "amp/* metrics added" not in out


def test_lightning_tensorboard_logger_gets_the_scaler_s_figures_at_every_step(tmp_path):
    pytest.importorskip("lightning")
    pytest.importorskip("tensorboard")
    steps = 12
    args = ("--out", str(tmp_path / "out"), "--steps", str(steps))
    out, record = _run(tmp_path, "zero_edit_lightning.py", *args, run_args=HEALING)
    assert "amp/* metrics added to Lightning Trainer's loggers (AmpMetricsCallback)" in out
    series = scalars(tmp_path / "out" / "tb")
    # Lightning writes a training step's logs at its own step counter: global_step - 1 after the step
    logged = {step + 1: values for step, values in by_step(series).items()}
    assert logged == {n: figures_after(record, n) for n in range(1, steps + 1)}
    assert logged[steps] == final_figures(record) and record["heals"] == 1 and record["skipped_steps"] >= 2


def test_mmengine_vis_backend_gets_the_scaler_s_figures_at_every_iteration(tmp_path):
    pytest.importorskip("mmengine")
    pytest.importorskip("tensorboard")
    steps = 12
    work = tmp_path / "work"
    out, record = _run(tmp_path, "zero_edit_mmengine.py", "--work-dir", str(work), "--steps", str(steps))
    assert "amp/* metrics added to mmengine Runner's loggers (AmpSafeHook)" in out
    logged = by_step(scalars(work))
    assert logged == {n: figures_after(record, n) for n in range(1, steps + 1)}
    assert 1 <= record["skipped_steps"] < steps


def test_ultralytics_results_csv_gets_the_scaler_s_figures_at_each_epoch(tmp_path):
    pytest.importorskip("ultralytics")
    out, record = _run(tmp_path, "zero_edit_yolo.py", "--scale", str(2**24))
    assert "amp/* metrics added to ultralytics trainer's loggers (on_train_epoch_end callback)" in out
    path = out.split("RESULTS ", 1)[1].splitlines()[0]
    with open(path, newline="") as f:
        rows = [{k.strip(): v for k, v in row.items()} for row in csv.DictReader(f)]
    names = list(final_figures(record))
    logged = [{name: float(row[name]) for name in names} for row in rows]
    assert len(logged) == 2 and record["skipped_steps"] >= 1
    # results.csv keeps 6 significant digits; each epoch's row is the state after that epoch's last step
    close = {name: pytest.approx(value, rel=1e-5) for name, value in final_figures(record).items()}
    assert logged[-1] == close
    first = [
        n for n in range(1, record["total_steps"]) if logged[0] == pytest.approx(figures_after(record, n), rel=1e-5)
    ]
    assert first, (logged, record["steps"])
