"""``ampsafe run`` and gradient underflow: a scaler's sampled underflow in report.json and the ``amp/*`` metrics,
and a float16 loop with no loss scaler named at step 0, measured, and fixed by the lines its report prints."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from run_helpers import SCRIPTS, ampsafe_run  # tests/run/run_helpers.py

from ampsafe.run.records import GuardRecord, ScalerRecord

STEPS = 12


def _report(folder: Path) -> dict:
    return json.loads((folder / "report.json").read_text())


def _last_scalars(logdir: Path) -> dict[str, float]:
    """tag -> its last value in the TensorBoard event files under ``logdir`` (tensorboard's own reader)."""
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    found = {}
    for path in sorted(logdir.rglob("events.out.tfevents.*")):
        reader = event_accumulator.EventAccumulator(str(path), size_guidance={event_accumulator.SCALARS: 0})
        reader.Reload()
        found.update({tag: reader.Scalars(tag)[-1].value for tag in reader.Tags()["scalars"]})
    return found


def test_a_forced_low_scale_s_underflow_is_in_report_json_and_the_metrics(tmp_path):
    pytest.importorskip("torch")
    report, board = tmp_path / "report", tmp_path / "tb"
    args = ["--min-scale", "0", "--report", str(report), "--tensorboard", str(board), "--"]
    script = [sys.executable, str(SCRIPTS / "train_torch.py"), "--steps", str(STEPS), "--init-scale", str(2.0**-16)]
    proc = ampsafe_run(*args, *script)
    assert proc.returncode == 0, proc.stderr[-3000:]
    scaler = ScalerRecord.from_dict(_report(report)["scalers"][0])
    u = scaler.underflow
    assert u is not None and u.every == 10
    assert [r[0] for r in u.series] == [*range(10), 10]  # the headroom sampler's steps: the first 10, then every 10th
    step, scale, zero, subnormal = u.latest
    assert scale == 2.0**-16 and u.elements == 16 * 32 + 32 + 32 + 1
    assert zero > 0.2  # at 2**-16 a large part of the gradient rounds to zero in float16
    assert set(u.modules) <= {"0", "2"} and u.lost_below and u.lost_below[0][0] == scale / 2
    logged = _last_scalars(board)
    assert logged["amp/grad_zero_frac"] == pytest.approx(zero, rel=1e-6)
    assert logged["amp/grad_subnormal_frac"] == pytest.approx(subnormal, rel=1e-6, abs=1e-9)
    assert "## Gradient underflow" in (report / "report.md").read_text()


def _patched(source: str, lines: dict) -> str:
    """The script with the report's lines applied as a user would: the scaler after the optimizer, the backward
    and the step replaced, the update right after the step (each at the indentation of the line it replaces)."""
    out = []
    for line in source.splitlines():
        indent = re.match(r"\s*", line).group(0)
        if line.strip() == lines["replaces_backward"]:
            out.append(indent + lines["backward"])
        elif line.strip() == lines["replaces_step"]:
            out += [indent + lines["step"], indent + lines["update"]]
        else:
            out.append(line)
            if line.strip().startswith("optimizer = "):
                out.append(indent + lines["create"])
    return "\n".join(out) + "\n"


def _run(tmp_path: Path, script: Path, name: str, *options: str) -> tuple[dict, list[float]]:
    report, losses = tmp_path / name, tmp_path / f"{name}-losses.json"
    command = [sys.executable, str(script), "--steps", str(STEPS), "--out", str(losses)]
    proc = ampsafe_run(*options, "--report", str(report), "--", *command)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return _report(report), json.loads(losses.read_text())["losses"]


@pytest.mark.slow  # two runs of the script
def test_a_float16_backward_with_no_scaler_is_named_at_step_0_and_the_printed_lines_train(tmp_path):
    pytest.importorskip("torch")
    script = SCRIPTS / "train_fp16_no_scaler.py"
    data, losses = _run(tmp_path, script, "plain")
    assert data["scalers"] == []
    guard = GuardRecord.from_dict(data["guards"][0])
    n = guard.no_scaler
    assert n is not None and (n.step, n.why, n.steps) == (0, "float16 autocast", STEPS)
    assert n.nonfinite_steps == () and guard.skipped_steps == 0
    assert n.underflow is not None and n.underflow.samples == 11 and n.underflow.latest[1] == 1.0
    plain_zero = n.underflow.latest[2]
    assert plain_zero > 0.3  # the loss term's gradients sit at float16's subnormal edge at scale 1
    assert n.lines is not None and n.lines.create == 'scaler = torch.amp.GradScaler("cpu")'

    source = script.read_text()
    patched_source = _patched(source, n.lines.to_dict())
    assert patched_source != source and n.lines.create in patched_source
    patched = tmp_path / "train_fp16_scaled.py"
    patched.write_text(patched_source)
    data2, losses2 = _run(tmp_path, patched, "scaled")
    scaler = ScalerRecord.from_dict(data2["scalers"][0])
    assert scaler.total_steps == STEPS and len(scaler.steps) == STEPS and scaler.overflow_steps == 0
    assert all(g.get("no_scaler") is None for g in data2["guards"])
    assert all(map(lambda v: v == v and abs(v) < float("inf"), losses2))
    assert losses2[-1] < 0.8 * losses2[0]  # it trains
    scaled_zero = scaler.underflow.latest[2]
    assert scaled_zero < 0.5 * plain_zero and scaled_zero < 0.05  # the scale lifts the gradient out of underflow


@pytest.mark.slow  # two runs of the script
def test_paddle_float16_with_no_scaler_is_named_at_step_0_and_paddle_s_printed_lines_train(tmp_path):
    pytest.importorskip("paddle")
    script = SCRIPTS / "train_paddle_fp16_no_scaler.py"
    data, _ = _run(tmp_path, script, "plain", "--emulate-fp16")
    n = GuardRecord.from_dict(data["guards"][0]).no_scaler
    assert n is not None and n.step == 0 and n.why.startswith("float16 auto_cast")
    assert n.lines.framework == "paddle" and n.lines.create.startswith("scaler = paddle.amp.GradScaler(")
    plain_zero = n.underflow.latest[2]
    assert plain_zero > 0.3

    patched = tmp_path / "train_paddle_fp16_scaled.py"
    patched.write_text(_patched(script.read_text(), n.lines.to_dict()))
    data2, losses2 = _run(tmp_path, patched, "scaled", "--emulate-fp16")
    scaler = ScalerRecord.from_dict(data2["scalers"][0])
    assert scaler.framework == "paddle" and scaler.total_steps == STEPS and scaler.overflow_steps == 0
    assert all(g.get("no_scaler") is None for g in data2["guards"])
    assert all(v == v and abs(v) < float("inf") for v in losses2) and losses2[-1] < 0.8 * losses2[0]
    assert scaler.underflow.latest[2] < 0.5 * plain_zero and scaler.underflow.latest[2] < 0.05
