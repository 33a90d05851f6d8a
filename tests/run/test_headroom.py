"""``ampsafe run``'s headroom sampler (:mod:`ampsafe.run.headroom`): samples taken in the step's own forward equal
the module outputs' own abs-max and the unscaled gradient norm, add no forward per step, reach ``amp_metrics`` and
hold no model alive; the early warning comes before the first overflow on the t5 brink and the dbnet demo recipe,
named right, and never in 200 steps of healthy resnet18 and BERT training."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap

import pytest
from run_helpers import SCRIPTS, ampsafe_run

from ampsafe.core.headroom import KEPT_SAMPLES, keep_span
from ampsafe.run.headroom_trend import HORIZON, LOG2_MAX, trend
from ampsafe.run.options import RunOptions
from ampsafe.run.records import RunSummary


def test_a_steady_rise_projects_its_crossing_and_noise_or_a_fall_does_not():
    rising = [(s, 2.0 ** (10 + 0.5 * s)) for s in range(4)]  # 0.5 bits a step, 10 bits below log2(65504) - ...
    slope, headroom, crossing = trend(rising)
    assert slope == pytest.approx(0.5) and headroom == pytest.approx(LOG2_MAX - 11.5)
    assert crossing == pytest.approx(3 + (LOG2_MAX - 11.5) / 0.5)
    assert trend(rising[:2]) is None  # too few samples
    assert trend([(s, 2.0 ** (10 - 0.5 * s)) for s in range(6)]) is None  # falling
    assert trend([(s, 2.0 ** (10 + 0.05 * (-1) ** s)) for s in range(6)]) is None  # noise on a flat series
    assert trend([(0, 1.0), (1, None), (2, 2.0)]) is None  # a non-finite sample is not a point
    # 0.24 bits a step with half a bit left (t5 seed 2's wo): a smaller rise than noise's, but most of what is left
    near = [(s, 65504 / 2.0 ** (1.02 - 0.24 * s)) for s in range(3)]
    assert trend(near)[2] == pytest.approx(2 + (1.02 - 0.48) / 0.24)


def test_a_long_run_keeps_its_whole_span_within_the_cap():
    points: list = []
    for step in range(3 * KEPT_SAMPLES):
        keep_span(points, (step, 1.0))
    steps = [p[0] for p in points]
    assert len(points) <= KEPT_SAMPLES and steps[0] == 0 and steps[-1] == 3 * KEPT_SAMPLES - 1
    assert steps == sorted(steps) and steps[-KEPT_SAMPLES // 4 :] == list(
        range(3 * KEPT_SAMPLES - KEPT_SAMPLES // 4, 3 * KEPT_SAMPLES)
    )


def test_headroom_every_is_an_option_checked_where_it_is_written():
    assert RunOptions().headroom_every == 10 and RunOptions(headroom_every=0).headroom_every == 0
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(Exception, match="headroom_every"):
            RunOptions(headroom_every=bad)
    assert RunOptions.from_env({"AMPSAFE_RUN_OPTIONS": RunOptions(headroom_every=3).to_env()}).headroom_every == 3


SAMPLED = """
import gc, json, sys, weakref
import torch
from ampsafe.integrations.metrics import amp_metrics
from ampsafe.run.options import RunOptions
from ampsafe.run.session import RunSession

every, steps = int(sys.argv[1]), int(sys.argv[2])


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def train():
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**8)
    forwards, amax, norms = [0], {}, {}
    model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    model.fc1.register_forward_hook(lambda _m, _i, out: amax.__setitem__(len(norms), float(out.abs().max())))
    for step in range(steps):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(torch.randn(4, 8)).float().square().mean()
        scaler.scale(loss).backward()
        scaler.step(opt)  # unscales the gradients
        norms[step] = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])))
        scaler.update()
        opt.zero_grad()
    return weakref.ref(model), scaler, forwards[0], amax, norms


with RunSession(RunOptions(report=None, quiet=True, emulate_fp16=True, headroom_every=every)) as session:
    ref, scaler, forwards, amax, norms = train()
gc.collect()
record = session.summary().to_dict()["scalers"][0]["headroom"]
print(json.dumps({"freed": ref() is None, "forwards": forwards, "amax": amax, "norms": norms, "record": record,
                  "metrics": amp_metrics(scaler)}))
"""


def _sampled(every: int, steps: int) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SAMPLED), str(every), str(steps)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # subprocesses: ampsafe run's install is process-wide
def test_samples_are_the_step_s_own_outputs_and_unscaled_gradients_with_no_forward_added():
    out = _sampled(every=4, steps=14)
    record = out["record"]
    assert out["freed"], "the sampler kept the model alive"
    assert record["paths"] == "scan" and record["tracked"] >= 2
    fc1 = dict((s, a) for s, a in record["series"]["fc1"])
    # every step of the first 4, then every 4th: 0-3, 4, 8, 12
    assert sorted(fc1) == [0, 1, 2, 3, 4, 8, 12]
    for step, value in fc1.items():  # the float16 output's abs-max as float32
        assert value == pytest.approx(out["amax"][str(step)], rel=1e-3), step
    for step, norm in record["grad_norm"]:
        assert norm == pytest.approx(out["norms"][str(step)], rel=1e-4), step
    metrics = out["metrics"]
    assert metrics["amp/grad_norm_unscaled"] == pytest.approx(out["norms"]["12"], rel=1e-4)
    low = {k: v for k, v in metrics.items() if k.startswith("amp/headroom_bits/")}
    assert "amp/headroom_bits/fc1" in low and metrics["amp/min_headroom_bits"] == min(low.values())
    assert metrics["amp/headroom_bits/fc1"] == pytest.approx(LOG2_MAX - math.log2(fc1[12]), rel=1e-6)
    # sampling adds no forward to a step: the only forward besides the steps' is the one scan at step 1
    assert out["forwards"] - 14 == _sampled(every=1, steps=6)["forwards"] - 6 == 1
    assert _sampled(every=0, steps=6)["forwards"] == 6


def _run(tmp_path, script: str, *args: str, timeout: int = 600) -> tuple[RunSummary, str, str]:
    proc = ampsafe_run(
        "--emulate-fp16", "--report", str(tmp_path), "--", sys.executable, str(SCRIPTS / script), *args, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((tmp_path / "report.json").read_text())
    return RunSummary.from_dict({k: v for k, v in data.items() if k in ("pid", "scalers")}), proc.stderr, data


def _warned_before_overflow(summary: RunSummary):
    (scaler,) = summary.scalers
    alert = scaler.headroom.alert
    first = next(r[0] for r in scaler.steps if r[2])
    assert alert is not None, scaler.headroom
    assert alert.step <= first - 2, (alert, first)
    return alert, first


@pytest.mark.slow
@pytest.mark.trajectory
def test_t5_brink_warns_at_least_two_steps_before_wo_overflows(tmp_path, brink_seed):
    pytest.importorskip("transformers")
    summary, stderr, _data = _run(tmp_path, "headroom_t5.py", str(brink_seed), "8")
    alert, first = _warned_before_overflow(summary)
    assert alert.module == "decoder.block.1.layer.2.DenseReluDense.wo"
    assert alert.crossing_step <= first + HORIZON and alert.message in stderr
    md = (tmp_path / "report.md").read_text()
    assert f"**Early warning at step {alert.step}:**" in md and "![float16 headroom](headroom.png)" in md
    assert (tmp_path / "headroom.png").stat().st_size > 10_000


@pytest.mark.slow
@pytest.mark.trajectory
def test_dbnet_demo_recipe_warns_at_least_two_steps_before_the_head_overflows(tmp_path, brink_seed):
    pytest.importorskip("paddle")
    summary, stderr, data = _run(tmp_path, "headroom_dbnet.py", str(brink_seed), "24")  # seed 2 overflows at 16
    alert, first = _warned_before_overflow(summary)
    # the head conv that overflows first (the demo's) is named, with the other head conv on the same DBFPN path
    overflowed = [m for m, points in summary.scalers[0].headroom.series.items() if dict(points).get(first, 1) is None]
    assert "head.binarize.conv1" in overflowed
    assert "head.binarize.conv1" in (alert.module, *alert.also) and alert.message in stderr
    assert data["scalers"][0]["headroom"]["alert"]["module"] == alert.module  # report.json holds it


@pytest.mark.slow
@pytest.mark.parametrize("model", ["resnet18", "bert"])
def test_healthy_training_never_warns_in_200_steps(tmp_path, model):
    pytest.importorskip("torchvision" if model == "resnet18" else "transformers")
    summary, stderr, _data = _run(tmp_path, "headroom_healthy.py", model, "200")
    (scaler,) = summary.scalers
    assert scaler.headroom.samples >= 200 // scaler.headroom.every and scaler.headroom.alert is None
    assert "passes 65504" not in stderr
