"""``ampsafe run --emulate-fp16`` on the upstream trainers' own loops, on a CPU: a torchvision
``references/detection``-shaped loop (``torch.cuda.amp``) and PaddleDetection's own ``ppdet.engine.Trainer``
(``--amp``), real models, tiny synthetic data. The scripts know nothing about ampsafe (tests/run/scripts/)."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"


from run_helpers import ampsafe_run, stepped_scaler  # noqa: E402  (tests/run/run_helpers.py)

# --------------------------------------------------------------------------------------------- torchvision


def _reference(*args: str) -> list[str]:
    return ["--", sys.executable, str(SCRIPTS / "train_detection_reference.py"), *args]


@pytest.mark.slow
def test_torchvision_reference_loop_overflows_float16_and_heals_the_box_head(tmp_path):
    pytest.importorskip("torchvision")
    # --head-gain 245: the RoI box head's fc7 output is 41k-46k on these batches in FP32 (within one bit of
    # 65504, finite in float16), so the scaled backward overflows. --min-scale 16384 puts the floor two
    # backoffs away (65536 -> 32768 -> 16384) instead of sixteen, so the floor verdict comes at step 2.
    proc = ampsafe_run(
        "--emulate-fp16",
        "--min-scale",
        "16384",
        "--report",
        str(tmp_path / "report"),
        *_reference("--amp", "--steps", "4", "--head-gain", "245"),
    )
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, err[-3000:]
    assert "script: scaler ampsafe.auto.CudaGradScaler" in out  # torch.cuda.amp.GradScaler() resolved to ampsafe's
    assert "[ampsafe] torch.amp.GradScaler('cuda') / torch.cuda.amp.GradScaler -> GradScaler('cpu')" in err
    assert "ampsafe run: changed torch.autocast('cuda')" in out  # the emulator's lines are in the run's changes
    assert "Loss is" not in out and "script: done" in out  # the reference's non-finite-loss exit never fired
    scaler = stepped_scaler(tmp_path / "report")
    assert scaler.class_name == "ampsafe.torch.scaler.GradScaler", scaler
    # steps 0 and 1 overflowed in float16: skipped, the scale backs off to the floor
    backed_off = [row[1] for row in scaler.steps if row[0] in (1, 2)]  # the scales steps 1 and 2 ran with
    assert scaler.skipped_at[:2] == [0, 1] and backed_off == [32768.0, 16384.0], scaler
    (heal,) = scaler.heal_records  # the floor hit at step 2 heals the box head
    assert heal.step == 2 and "roi_heads.box_head.fc7" in heal.paths, heal
    assert scaler.total_steps == 4 and scaler.skipped_steps >= 3, scaler
    assert (scaler.floor_hits, scaler.heals) == (1, 1), scaler
    report = (tmp_path / "report" / "report.md").read_text()
    assert "roi_heads.box_head.fc7" in report  # the permanent fix names the head


def test_torchvision_reference_loop_without_emulation_has_the_scaler_disabled():
    pytest.importorskip("torchvision")
    proc = ampsafe_run("--report", "", *_reference("--amp", "--steps", "1", "--image-size", "64"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "script: step 0" in proc.stdout and "scale 1.0" in proc.stdout  # torch's own: disabled on a CPU
    assert "ampsafe.torch.scaler.GradScaler: disabled (CUDA not available)" in proc.stdout


# --------------------------------------------------------------------------------------------- ppdet Trainer


def _coco(root: Path, n: int = 4, size: int = 160) -> Path:
    """``n`` JPEGs of filled rectangles and their COCO json (two categories): the zoo sweep's writer."""
    from bench.zoo_ppdet_data import write_coco

    return write_coco(root, n, size)


def _overlay(path: Path, base: Path, data: Path, reader: str) -> Path:
    """A user's config over the upstream one: CPU, tiny synthetic COCO, one epoch, no downloads."""
    path.write_text(
        f"_BASE_: ['{base}']\n"
        "use_gpu: false\nlog_iter: 1\nepoch: 1\nsnapshot_epoch: 1000\nworker_num: 0\nnum_classes: 2\n"
        f"pretrain_weights: ''\nsave_dir: {path.parent / 'output'}\n"
        "TrainDataset:\n  name: COCODataSet\n"
        f"  dataset_dir: {data}\n  image_dir: images\n  anno_path: train.json\n"
        "  data_fields: ['image', 'gt_bbox', 'gt_class', 'is_crowd']\n" + reader
    )
    return path


# PP-YOLO tiny's own batch transforms, without the random resize / sample augmentations, batch 2
PPYOLO_READER = """TrainReader:
  sample_transforms:
    - Decode: {}
  batch_transforms:
    - NormalizeBox: {}
    - PadBox: {num_max_boxes: 10}
    - BboxXYXY2XYWH: {}
    - NormalizeImage: {mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225], is_scale: True}
    - Permute: {}
    - Gt2YoloTarget: {anchor_masks: [[6, 7, 8], [3, 4, 5], [0, 1, 2]], anchors: [[10, 15], [24, 36], [72, 42], [35, 87], [102, 96], [60, 170], [220, 125], [128, 222], [264, 266]], downsample_ratios: [32, 16, 8]}
  batch_size: 2
  shuffle: false
  drop_last: true
  mixup_epoch: -1
  use_shared_memory: false
"""

FRCNN_READER = """TrainReader:
  sample_transforms:
    - Decode: {}
    - NormalizeImage: {is_scale: true, mean: [0.485, 0.456, 0.406], std: [0.229, 0.224, 0.225]}
    - Permute: {}
  batch_transforms:
    - PadBatch: {pad_to_stride: 32}
  batch_size: 1
  shuffle: false
  drop_last: true
  collate_batch: false
  use_shared_memory: false
"""


def _trainer(config: Path, *args: str) -> list[str]:
    return ["--", sys.executable, str(SCRIPTS / "train_ppdet_trainer.py"), "-c", str(config), *args]


@pytest.mark.slow
def test_ppdet_trainer_ppyolo_tiny_amp_gets_ampsafes_scaler_under_emulation(upstream, tmp_path):
    pytest.importorskip("ppdet")
    data = _coco(tmp_path / "coco")
    base = upstream / "PaddleDetection/configs/ppyolo/ppyolo_tiny_650e_coco.yml"
    config = _overlay(tmp_path / "ppyolo_tiny.yml", base, data, PPYOLO_READER)
    # the default --on-bad-target raise: PadBox's all-zero rows are padding, not bad boxes
    proc = ampsafe_run("--emulate-fp16", "--report", str(tmp_path / "report"), *_trainer(config, "--amp"))
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, err[-3000:]
    assert "dropped bad box" not in err
    # ppdet passes enable=cfg.use_gpu (false on a CPU); the emulation runs its AMP as with use_gpu: true
    assert "[ampsafe] ppdet.engine.Trainer with amp: its GradScaler and auto_cast get enable=True" in err
    assert "script: Trainer scaler ampsafe.auto.GradScaler built with enable=True; enabled True" in out
    assert "script: done, amp True, use_gpu False" in out  # the Trainer's own config copy is restored
    scaler = stepped_scaler(tmp_path / "report")
    assert (scaler.framework, scaler.class_name) == ("paddle", "ampsafe.paddle.scaler.GradScaler"), scaler
    assert scaler.total_steps == 2  # 4 images, batch 2, one epoch: the Trainer's two steps went through it
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    # ppdet's LogPrinter line (its TrainingStats, which its VisualDL / W&B callbacks read too) carries amp/*: after
    # step k, the scale the next step runs with and the skips so far, as the scaler's own records say
    (record,) = [s for s in report["scalers"] if s["total_steps"]]
    assert "amp/* metrics added to ppdet's training stats" in out
    logged = {
        int(step) + 1: dict(re.findall(r"(amp/\w+): (\S+)", rest))
        for step, rest in re.findall(r"Epoch: \[0\] \[\s*(\d+)/\d+\] (.*)", out + err)
    }
    records = record["steps"]
    assert {n: (float(v["amp/loss_scale"]), float(v["amp/skipped_steps"])) for n, v in logged.items()} == {
        n: (records[n][1] if n < len(records) else record["scale"], sum(r[2] for r in records[:n])) for n in (1, 2)
    }

    # the same command without --emulate-fp16: ppdet's enable=False reaches ampsafe's scaler, which says so
    plain = ampsafe_run("--report", "", *_trainer(config, "--amp"))
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert "built with enable=False; enabled False" in plain.stdout
    assert "ampsafe.paddle.scaler.GradScaler: disabled by the script (enable=False)" in plain.stdout
    assert "amp/loss_scale" not in plain.stdout + plain.stderr  # a disabled scaler: no amp/* in the log line


@pytest.fixture(scope="module")
def frcnn_configs(upstream, tmp_path_factory):
    """Faster R-CNN FPN: a copy of the upstream config chain (2.0-era: ppdet 2.6.0 calls TwoFCHead's
    ``mlp_dim`` ``out_channel``, the one line changed), its ``ampsafe swap-neck`` overlay, and the user overlays."""
    root = tmp_path_factory.mktemp("frcnn")
    configs = root / "configs"
    source = upstream / "PaddleDetection/configs"
    for part in ("faster_rcnn", "datasets"):
        shutil.copytree(source / part, configs / part)
    shutil.copy(source / "runtime.yml", configs / "runtime.yml")
    model_yml = configs / "faster_rcnn/_base_/faster_rcnn_r50_fpn.yml"
    model_yml.write_text(model_yml.read_text().replace("  mlp_dim: 1024", "  out_channel: 1024"))
    upstream_cfg = configs / "faster_rcnn/faster_rcnn_r50_fpn_1x_coco.yml"
    swapped = root / "faster_rcnn_r50_fpn_safe.yml"
    proc = subprocess.run(
        [sys.executable, "-m", "ampsafe.cli", "swap-neck", str(upstream_cfg), "-o", str(swapped)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    data = _coco(root / "coco")
    (root / "up").mkdir()
    (root / "safe").mkdir()
    return {
        "root": root,
        "upstream": _overlay(root / "up" / "train.yml", upstream_cfg, data, FRCNN_READER),
        "safe": _overlay(root / "safe" / "train.yml", swapped, data, FRCNN_READER),
    }


@pytest.mark.slow
def test_ppdet_trainer_swapped_fpn_loads_the_upstream_checkpoint_under_emulation(frcnn_configs, tmp_path):
    pytest.importorskip("ppdet")
    paddle = pytest.importorskip("paddle")
    root = frcnn_configs["root"]
    checkpoint = root / "upstream.pdparams"
    # the "upstream checkpoint": the unswapped model built from the upstream config, saved by paddle.save
    saved = subprocess.run(
        [sys.executable, str(SCRIPTS / "train_ppdet_trainer.py"), "-c", str(frcnn_configs["upstream"])]
        + ["-o", "epoch=0", "--save-state", str(checkpoint)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert saved.returncode == 0, saved.stderr[-3000:]
    # the swapped model's own keys (no training: epoch 0), to compare with the checkpoint's
    swapped_state = root / "swapped.pdparams"
    keys = ampsafe_run(
        "--report", "", *_trainer(frcnn_configs["safe"], "-o", "epoch=0", "--save-state", str(swapped_state))
    )
    assert keys.returncode == 0, keys.stderr[-3000:]
    upstream_keys = set(paddle.load(str(checkpoint)))
    swapped_keys = set(paddle.load(str(swapped_state)))
    missing = swapped_keys - upstream_keys
    assert missing and all("_norm." in k for k in missing), sorted(missing)[:8]
    assert upstream_keys <= swapped_keys

    # two training steps (two of the four images) with 64 sampled RoIs per image instead of 512, for time only;
    # the script applies its ppdet 2.6.0 / Paddle 3 compat fix (0-D tensors in the RPN's paddle.concat)
    overrides = [f"pretrain_weights={checkpoint}", "TrainDataset.sample_num=2", "BBoxAssigner.batch_size_per_im=64"]
    report = tmp_path / "report"
    proc = ampsafe_run(
        "--emulate-fp16", "--report", str(report), *_trainer(frcnn_configs["safe"], "--amp", "-o", *overrides)
    )
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, err[-3000:]
    assert "changed ppdet necks registered: AmpSafeFPN" in out
    assert f"Finish loading model weights: {checkpoint}" in out + err  # ppdet's own checkpoint loader
    assert "[ampsafe] ppdet.engine.Trainer with amp: its GradScaler and auto_cast get enable=True" in err
    # ppdet's own iteration log: both steps ran the whole Faster R-CNN loss (RPN and RoI head), finite
    logged = re.findall(r"Epoch: \[0\] \[(\d+)/2\] .* loss_bbox_reg: \S+ loss: (\S+)", out + err)
    assert [int(i) for i, _ in logged] == [0, 1], (out + err)[-3000:]
    assert all(math.isfinite(float(loss)) for _, loss in logged), logged
    # ampsafe's scaler was built by the Trainer, enabled (not "disabled by the script (enable=False)"), and
    # both steps went through it without a skip (the scale stays at ppdet's 1024)
    assert "script: Trainer scaler ampsafe.auto.GradScaler built with enable=True; enabled True, scale 1024.0" in out
    scaler = stepped_scaler(report)
    assert scaler.class_name == "ampsafe.paddle.scaler.GradScaler" and scaler.disabled_reason is None, scaler
    assert (scaler.total_steps, scaler.skipped_steps, scaler.scale) == (2, 0, 1024.0), scaler
    assert "script: done, amp True, use_gpu False" in out
