"""The one headroom monitor (``ampsafe.core.headroom``) under both rules, and the scaler's metric sources."""

from __future__ import annotations

import math

import pytest

from ampsafe._framework import backend_named
from ampsafe.core.headroom import HeadroomMonitor, ThresholdRule
from ampsafe.core.sentinel import HeadroomWarning
from ampsafe.integrations.metrics import amp_metrics
from ampsafe.run.headroom_trend import LOG2_MAX, TrendRule

torch = pytest.importorskip("torch")


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4, bias=False)
        self.act = torch.nn.ReLU()
        torch.nn.init.eye_(self.fc.weight)

    def forward(self, x):
        return self.act(self.fc(x))


def test_one_monitor_serves_the_watch_threshold_and_the_run_trend():
    model = _Net()
    warnings: list[HeadroomWarning] = []
    said: list[str] = []
    threshold, trend = ThresholdRule(3.5, warnings.append), TrendRule(1, said.append)
    monitor = HeadroomMonitor(backend_named("torch"), model, rules=(threshold, trend))
    monitor.track_conv_linear()
    assert list(monitor.layers) == ["fc"] and monitor.paths == [("fc", ("fc",))]
    for step in range(8):  # one bit of headroom lost per step, from 8 bits left
        monitor.arm(step)
        model(torch.full((2, 4), 2.0 ** (LOG2_MAX - 8 + step)))
        amax = monitor.collect(step)
        assert amax["fc"] == pytest.approx(2.0 ** (LOG2_MAX - 8 + step))
    assert [v for _, v in monitor.series["fc"]] == pytest.approx([2.0 ** (LOG2_MAX - 8 + s) for s in range(8)])
    assert [(w.step, w.start) for w in warnings] == [(5, "fc")]  # below 3.5 bits once, warned once
    assert trend.alert is not None and trend.alert.module == "fc" and trend.alert.step < 5 and len(said) == 1


def test_only_the_armed_step_s_training_forward_is_measured():
    model = _Net()
    monitor = HeadroomMonitor(backend_named("torch"), model)
    monitor.track_conv_linear()
    model(torch.full((1, 4), 1000.0))  # not armed: no hook
    monitor.arm(3)
    model.eval()
    model(torch.full((1, 4), 500.0))  # an evaluation forward between steps is not the step's
    model.train()
    model(torch.full((1, 4), 2.0))
    assert monitor.collect(2) is None  # another step's sample is not this one's
    monitor.arm(3)
    model(torch.full((1, 4), 3.0))
    assert monitor.collect(3) == {"fc": 3.0} and monitor.samples == 1
    assert not model.fc._forward_hooks


class _Source:
    def metrics(self) -> dict:
        return {"amp/min_headroom_bits": 2.5}


def test_amp_metrics_reads_the_scaler_s_metric_sources():
    from ampsafe.torch import GradScaler

    scaler = GradScaler("cpu", init_scale=8.0)
    assert "amp/min_headroom_bits" not in amp_metrics(scaler)
    scaler.metric_sources.append(_Source())
    metrics = amp_metrics(scaler)
    assert metrics["amp/min_headroom_bits"] == 2.5 and metrics["amp/loss_scale"] == 8.0
    assert math.isfinite(metrics["amp/overflow_steps"])
    assert amp_metrics(torch.amp.GradScaler("cpu", init_scale=8.0)) == {"amp/loss_scale": 8.0}
