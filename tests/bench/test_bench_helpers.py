"""The accuracy / throughput benchmarks' own logic: spreads over seeds, deltas to FP32, throughput ratios,
the GPU script's refusal without CUDA, and plots that survive failed runs."""

from __future__ import annotations

import json
import math

import pytest

from bench.bench_accuracy import LABELS, mode_table, spread
from bench.bench_throughput import ratios


def test_spread_ignores_failed_runs_and_uses_sample_std():
    s = spread([0.6, None, 0.8, float("nan")])
    assert s["n"] == 2 and s["failed"] == 2
    assert s["mean"] == pytest.approx(0.7)
    assert s["std"] == pytest.approx(math.sqrt(0.02))  # sample std of (0.6, 0.8)
    assert (s["min"], s["max"]) == (0.6, 0.8)
    assert spread([None])["mean"] is None


def test_mode_table_reports_delta_to_fp32_in_points_per_mode():
    runs = [
        {"mode": "fp32", "seed": 0, "metric": 0.70, "overflowing_steps": 0, "final_loss": 2.0},
        {"mode": "fp32", "seed": 1, "metric": 0.72, "overflowing_steps": 0, "final_loss": 2.1},
        {"mode": "native", "seed": 0, "metric": 0.04, "overflowing_steps": 29, "final_loss": 4.9},
        {"mode": "native", "seed": 1, "metric": None, "error": "LossScaleFloorError: x", "overflowing_steps": None},
    ]
    rows, md = mode_table(runs, metric="hmean", labels=LABELS)
    by_mode = {r["mode"]: r for r in rows}
    assert by_mode["fp32"]["delta_points"] == pytest.approx(0.0)
    assert by_mode["native"]["delta_points"] == pytest.approx(100 * (0.04 - 0.71))
    assert by_mode["native"]["metric"]["failed"] == 1 and by_mode["native"]["errors"] == ["LossScaleFloorError: x"]
    assert "| float16, native scaler | 0,1 (1 failed) | 0.040 |" in md and "-67.0" in md
    assert by_mode["native"]["paired"]["mean"] == pytest.approx(100 * (0.04 - 0.70))  # seed 0 only: seed 1 failed
    assert "-66.0 ± 0.0" in md


def test_paired_difference_cancels_what_seeds_share():
    runs = [{"mode": "fp32", "seed": s, "metric": m} for s, m in enumerate((0.6, 0.8, 0.9))]
    runs += [{"mode": "island", "seed": s, "metric": m - 0.01} for s, m in enumerate((0.6, 0.8, 0.9))]
    rows, _ = mode_table(runs, metric="hmean", labels=LABELS)
    island = next(r for r in rows if r["mode"] == "island")
    assert island["metric"]["std"] > 0.1  # the seeds' spread ...
    assert island["paired"]["mean"] == pytest.approx(-1.0) and island["paired"]["std"] == pytest.approx(0.0, abs=1e-9)


def test_throughput_ratios_compare_each_mode_with_fp32_and_islands_with_fp16():
    rows = [
        {"mode": "fp32", "images_per_s": 10.0},
        {"mode": "fp16", "images_per_s": 20.0},
        {"mode": "fp16+island", "images_per_s": 19.0},
        {"mode": "bf16", "error": "RuntimeError: no kernel"},
    ]
    rel = ratios(rows)
    assert rel["fp16/fp32"] == pytest.approx(2.0) and rel["fp16+island/fp32"] == pytest.approx(1.9)
    assert rel["fp16+island/fp16"] == pytest.approx(0.95)
    assert "bf16/fp32" not in rel


def test_gpu_bench_refuses_to_run_without_cuda_unless_dry_run(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the refusal path cannot be reached")
    from bench.gpu_bench import main

    assert main(["--only", "fidelity"]) == 2
    assert "torch.cuda.is_available() is False" in capsys.readouterr().out


def test_plot_training_writes_a_png_when_runs_failed_or_overflowed(tmp_path):
    from bench.plots import plot_training

    runs = [
        {"mode": "fp32", "seed": 0, "losses": [3.0, 2.0, 1.5], "scales": [1.0, 1.0, 1.0], "metric": 0.7},
        {
            "mode": "native",
            "seed": 0,
            "losses": [3.0, float("nan"), 2.9],
            "scales": [1024.0, 512.0, 0.0],
            "metric": 0.0,
        },
        {"mode": "island", "seed": 0, "metric": None},  # failed before any step
    ]
    path = plot_training(runs, tmp_path / "acc.png", "t", metric="hmean")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_zoo_run_limit_stops_ampsafe_run_as_ctrl_c_so_its_report_is_written(tmp_path):
    """A training run cut at the zoo's run limit still gets ampsafe run's report, written after the cut: the
    limit sends Ctrl-C to the run's process group instead of killing it, and the run hears it even when the
    sweep ignores SIGINT (started with nohup or &, as a sweep of hours is)."""
    import signal
    import sys

    from bench.zoo_ppdet import run_group

    report = tmp_path / "report"
    command = [sys.executable, "-c", "import time; time.sleep(300)"]
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # what a background sweep's children inherit
    try:
        code, log = run_group([sys.executable, "-m", "ampsafe.cli", "run", "--report", str(report), "--", *command],
                              timeout=10)  # fmt: skip
    finally:
        signal.signal(signal.SIGINT, before)
    assert code == 124 and "timeout after 10 s" in log
    written = json.loads((report / "report.json").read_text())
    assert written["returncode"] == 130, written  # the command's status after the Ctrl-C: written after the cut


def test_ppocr_summary_keeps_the_last_loss_known_when_the_run_stopped_before_printing_it():
    """A step whose loss comes from PaddleOCR's printed log (the scaled loss did not read as one number) has none
    when the run stopped before printing it: the summary's final loss is the last one known, finite."""
    from bench.ppocr_optin import summarize

    steps = [
        {"step": 0, "loss": 21.2, "scale": 1024.0, "found_inf": False},
        {"step": 1, "loss": 16.2, "scale": 1024.0, "found_inf": False},
        {"step": 2, "loss": None, "scale": 1024.0, "found_inf": False},
    ]
    summary = summarize(steps)
    assert (summary["first_loss"], summary["final_loss"], summary["steps"]) == (21.2, 16.2, 3)
    steps[1]["loss"] = float("nan")  # a non-finite loss stays the final one
    assert math.isnan(summarize(steps)["final_loss"])


def test_ppocr_zoo_run_cut_at_its_limit_reads_the_losses_its_log_printed(tmp_path):
    """A CML-like run (its scaled loss not one number) cut at the sweep's limit: its row's losses are the ones
    PaddleOCR printed before the cut, as for a run that ended by itself."""
    from bench.zoo_ppocr import _timed_out

    steps = [{"step": i, "loss": None, "scale": 1024.0, "found_inf": False} for i in range(3)]
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in steps))
    printed = "epoch: [1/1], global_step: {}, lr: 0.001, loss: {}, avg_reader_cost: 0.1 s\n"
    (tmp_path / "log.txt").write_text(printed.format(1, 19.0) + printed.format(2, 18.5))
    result = _timed_out(tmp_path, 600)
    assert (result["first_loss"], result["final_loss"], result["steps"]) == (19.0, 18.5, 3)
    assert result["returncode"] == -9 and "over 600 s" in result["error"]
