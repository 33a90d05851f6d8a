"""PaddleOCR's static-scale trap: its own, unmodified ``tools/train.py -c configs/det/det_mv3_db.yml`` with only
``Global.use_amp=True`` (so ``amp_level`` O2, ``scale_loss`` 1.0, ``use_dynamic_loss_scaling`` False: the
defaults ``tools/train.py`` reads) under ``ampsafe run --emulate-fp16``, on synthetic text images (8 images of
96 px, batch 2: 4 steps; ``bench/ppocr_optin.py``'s data, shim and launcher).

The run names the trap in its typed record (``report.json``'s ``static_scale``: O2, scale 1, not dynamic) and
measures the gradient underflow on the first step whose gradients are finite (step 3: DBHead's ``exp`` overflows
at O2 until the heal islands ``head`` at step 2, so steps 0-2 are skipped in every run and step 3 starts from the
same weights). The printed fix, applied as a user would (the ``-o`` overrides on the command line, or the keys in
a copy of the YAML config), turns on dynamic scaling from the chosen scale: the rerun's step 3 has fewer elements
zero and far fewer subnormal in float16, no static-scale record, and a finite loss.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from ampsafe.run.records import RunSummary, ScalerRecord

pytestmark = pytest.mark.slow

STEPS, BATCH, SIZE = 4, 2, 96
BANNER = (
    "[ampsafe] paddle's GradScaler(init_loss_scaling=1.0, use_dynamic_loss_scaling=False), from PaddleOCR's "
    "Global.scale_loss / Global.use_dynamic_loss_scaling (defaults 1.0 / False): a static loss scale of 1, no "
    "dynamic scaling"
)
SCALE_KEYS = ("Global.amp_level", "Global.scale_loss", "Global.use_dynamic_loss_scaling")


@pytest.fixture(scope="module")
def work(paddleocr_src, tmp_path_factory):
    from bench.ppocr_optin import write_dataset

    root = tmp_path_factory.mktemp("ppocr-static")
    write_dataset(root / "data", count=STEPS * BATCH, size=SIZE)
    return root


def _train(src: Path, work: Path, name: str, extra: list[str], config: str | None = None) -> dict:
    """One ``ampsafe run --emulate-fp16 -- python tools/train.py -c CONFIG -o ... Global.use_amp=True EXTRA``."""
    from bench.ppocr_optin import CONFIG, command, launch, overrides

    out = work / name
    out.mkdir(exist_ok=True)
    opts = [o for o in overrides(src, work / "data", out, "O2", size=SIZE, batch=BATCH) if not o.startswith(SCALE_KEYS)]
    assert "Global.use_amp=True" in opts
    cmd = command("ampsafe", config or CONFIG, [*opts, *extra], report=out / "report")
    r = launch(src, work, out, cmd, {"run": name}, stop_after=STEPS, timeout=300)
    assert r["returncode"] == 0 and r["steps"] == STEPS, r["log_tail"]
    (scaler,) = [s for s in RunSummary.from_dict(r["report"]).scalers if s.total_steps]
    r["scaler"] = scaler
    return r


def _first_finite(scaler: ScalerRecord) -> tuple:
    """The underflow sample ``(step, scale, zero, subnormal)`` of the first step whose gradients were finite."""
    clean = next(step for step, _, overflow, _ in scaler.steps if not overflow)
    return next(sample for sample in scaler.underflow.series if sample[0] == clean)


_runs: dict = {}


def _trapped(src: Path, work: Path) -> dict:
    if "trap" not in _runs:
        _runs["trap"] = _train(src, work, "use-amp-only", [])
    return _runs["trap"]


def test_use_amp_alone_is_named_o2_static_scale_1_and_measured(paddleocr_src, work):
    r = _trapped(paddleocr_src, work)
    t = r["scaler"].static_scale
    assert t is not None, r["log_tail"]
    assert (t.level, t.scale, t.dynamic) == ("O2", 1.0, False)
    assert t.words == "O2, static loss scale 1, no dynamic scaling"
    assert t.kwargs == {"init_loss_scaling": "1.0", "use_dynamic_loss_scaling": "False"}  # what Paddle received
    # the measurement: the first step whose gradients were finite, at scale 1
    assert _first_finite(r["scaler"]) == (t.step, 1.0, t.zero, t.subnormal)
    assert t.subnormal > 0.02  # at scale 1 a part of the gradient sits below float16's smallest normal
    # the fix: dynamic scaling from a power of two chosen from the measurement, in PaddleOCR's own keys
    assert t.chosen_scale > 1 and math.log2(t.chosen_scale).is_integer() and t.subnormal_at_chosen <= 0.01
    assert t.trainer == "PaddleOCR"
    assert t.config == {"Global.use_dynamic_loss_scaling": "True", "Global.scale_loss": f"{t.chosen_scale:g}"}
    assert t.overrides == f"-o Global.use_dynamic_loss_scaling=True Global.scale_loss={t.chosen_scale:g}"
    # named in the banner as the scaler is built and at the measured step, and in report.md
    log = (work / "use-amp-only" / "log.txt").read_text(encoding="utf-8")
    assert BANNER in log and f"[ampsafe] step {t.step}: {t.words}: " in log and t.overrides in log
    assert f"**paddle scaler: {t.words}**" in r["report_md"] and t.overrides in r["report_md"]


def _applied_yaml(src: Path, work: Path, config: dict) -> str:
    """A copy of det_mv3_db.yml with the printed keys set, each value read as YAML (as PaddleOCR reads ``-o``)."""
    import yaml

    from bench.ppocr_optin import CONFIG

    data = yaml.safe_load((src / CONFIG).read_text(encoding="utf-8"))
    for key, value in config.items():
        section, name = key.split(".")
        data[section][name] = yaml.safe_load(value)
    path = work / "det_mv3_db_fixed.yml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("form", ["overrides", "yaml"])
def test_the_printed_fix_lifts_the_gradient_out_of_underflow_and_trains(paddleocr_src, work, form):
    trap = _trapped(paddleocr_src, work)
    t = trap["scaler"].static_scale
    if form == "overrides":
        flag, *pairs = t.overrides.split()
        assert flag == "-o"
        r = _train(paddleocr_src, work, "fixed-o", pairs)  # the pairs go after the run's other -o pairs
    else:
        r = _train(paddleocr_src, work, "fixed-yaml", [], config=_applied_yaml(paddleocr_src, work, t.config))
    s = r["scaler"]
    assert s.static_scale is None and s.script_kwargs["use_dynamic_loss_scaling"] == "True"
    assert float(s.script_kwargs["init_loss_scaling"]) == t.chosen_scale
    before, after = _first_finite(trap["scaler"]), _first_finite(s)
    assert before[0] == after[0] and after[1] == t.chosen_scale  # the same step, from the same weights
    # fewer elements flushed to zero (1.8e-4 of them on this machine), far fewer subnormal
    assert after[2] < before[2] - 5e-5, (before, after)
    assert after[3] < 0.2 * before[3] and after[3] < 0.02, (before, after)
    # it trains: the steps after the heal update the weights, every loss finite
    assert [overflow for _, _, overflow, _ in s.steps[after[0] :]] == [False] * (STEPS - after[0]), s.steps
    losses = [step["loss"] for step in r["per_step"]]
    assert len(losses) == STEPS and all(math.isfinite(v) for v in losses), losses
