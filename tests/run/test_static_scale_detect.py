"""The static-scale trap's two pure parts: which scalers ``ampsafe run`` names (a Paddle scaler as the script
built it, read from its policy), and the scale it proposes from one measurement (:func:`lift_scale`)."""

from __future__ import annotations

import pytest

from ampsafe.core.underflow import Underflow, lift_scale
from ampsafe.run.static_scale import static_scale_of


def _underflow(scale: float, exponents: dict[int, int]) -> Underflow:
    return Underflow(
        step=0,
        scale=scale,
        elements=sum(exponents.values()),
        zero=0.0,
        subnormal=0.0,
        exponents=tuple(sorted(exponents.items())),
    )


def test_lift_scale_takes_the_lowest_power_of_two_that_leaves_at_most_1_percent_subnormal():
    # 1000 elements: 2% in bin -20, 8% in bin -16, the rest in bin -5; at scale 1 10% sit below 2**-14
    u = _underflow(1.0, {-20: 20, -16: 80, -5: 900})
    assert u.subnormal_at(1.0) == pytest.approx(0.10)
    assert u.subnormal_at(4.0) == pytest.approx(0.10)  # bin -16 -> -14, (2**-15, 2**-14]: counted as below
    assert u.subnormal_at(8.0) == pytest.approx(0.02)
    assert lift_scale(u) == 2.0**7  # bin -20 lifted to -13: none left below 2**-14
    assert u.subnormal_at(2.0**7) == 0.0 and u.subnormal_at(2.0**6) == pytest.approx(0.02)


def test_lift_scale_keeps_the_largest_gradient_4_bits_below_float16s_top():
    u = _underflow(1.0, {-30: 50, 9: 950})  # a gradient near 2**9: at most 2**(16 - 4 - 9) = 8
    assert lift_scale(u) == 8.0
    assert lift_scale(_underflow(1.0, {-30: 50, 14: 950})) == 1.0  # never below the measured scale


@pytest.mark.parametrize(
    "kwargs, named",
    [
        (dict(init_loss_scaling=1.0, use_dynamic_loss_scaling=False), 1.0),  # PaddleOCR's use_amp: True alone
        (dict(init_loss_scaling=1024.0, use_dynamic_loss_scaling=False), None),  # a deliberate fixed scale
        (dict(init_loss_scaling=1.0), None),  # dynamic: it grows
        (dict(fp32_guard=True), None),  # ampsafe's FP32 guard: no scaling by design
        (dict(enable=False, init_loss_scaling=1.0, use_dynamic_loss_scaling=False), None),  # disabled
    ],
)
def test_a_paddle_scaler_is_named_only_when_built_static_at_scale_1(kwargs, named):
    pytest.importorskip("paddle")
    from ampsafe.paddle import GradScaler

    class Scaler(GradScaler):  # the run's class answers _run_scale (ampsafe.run.scaler_class)
        def _run_scale(self):
            return float(self.get_loss_scaling())

    assert static_scale_of(Scaler(emulated=True, min_loss_scaling=0.0, **kwargs)) == named


@pytest.mark.slow  # two runs of the script
def test_any_script_s_static_scaler_of_1_is_named_and_the_printed_line_fixes_it(tmp_path):
    """Not only PaddleOCR: a plain Paddle loop that builds ``GradScaler(init_loss_scaling=1.0,
    use_dynamic_loss_scaling=False)`` is named from the scaler it built; the framework's line, put in place of
    the script's own scaler line, lifts its gradient out of float16's underflow and trains."""
    pytest.importorskip("paddle")
    import json
    import math
    import sys

    from run_helpers import SCRIPTS, ampsafe_run, stepped_scaler  # tests/run/run_helpers.py

    def run(script, name):
        report, losses = tmp_path / name, tmp_path / f"{name}.json"
        command = [sys.executable, str(script), "--out", str(losses)]
        proc = ampsafe_run("--emulate-fp16", "--report", str(report), "--", *command)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return stepped_scaler(report), json.loads(losses.read_text())["losses"], proc.stderr

    script = SCRIPTS / "train_paddle_static_scale.py"
    scaler, _, banner = run(script, "static")
    t = scaler.static_scale
    assert t is not None and (t.level, t.scale, t.dynamic) == ("O1", 1.0, False), scaler
    assert t.words == "O1, static loss scale 1, no dynamic scaling" and t.trainer == "" and not t.overrides
    assert f"[ampsafe] step {t.step}: {t.words}: " in banner and t.code in banner
    assert t.step == 0 and t.zero > 0.2 and t.chosen_scale > 1  # the loss term's gradients flush at scale 1
    assert t.code == (
        f"scaler = paddle.amp.GradScaler(init_loss_scaling={t.chosen_scale:g}, use_dynamic_loss_scaling=True)"
    )

    own = "scaler = paddle.amp.GradScaler(init_loss_scaling=1.0, use_dynamic_loss_scaling=False)"
    fixed = tmp_path / "train_paddle_dynamic_scale.py"
    fixed.write_text(script.read_text().replace(own, t.code))
    assert t.code in fixed.read_text()
    scaler2, losses, _ = run(fixed, "dynamic")
    assert scaler2.static_scale is None and scaler2.overflow_steps == 0
    zero_before, zero_after = scaler.underflow.series[0][2], scaler2.underflow.series[0][2]
    assert zero_after < 0.5 * zero_before, (scaler.underflow.series[0], scaler2.underflow.series[0])
    assert all(math.isfinite(v) for v in losses) and losses[-1] < losses[0]
