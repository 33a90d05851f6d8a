"""The ``ppyolo`` workload: PP-YOLO from the upstream PaddleDetection configs through ppdet's own registry."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ampsafe
from ampsafe_lab.workloads import build

paddle = pytest.importorskip("paddle")
pytest.importorskip("ppdet")


def _registry_state():
    from ppdet.core.config.schema import SchemaDict
    from ppdet.core.workspace import global_config

    return {k: (dict(v) if isinstance(v, SchemaDict) else v) for k, v in global_config.items()}


def test_ppyolo_tiny_is_built_from_the_upstream_config(det_ppyolo_tiny, upstream):
    from ppdet.modeling import YOLOv3

    w = det_ppyolo_tiny
    assert w.framework == "paddle" and isinstance(w.model, YOLOv3) and w.model.training
    assert w.config_path == upstream / "PaddleDetection/configs/ppyolo/ppyolo_tiny_650e_coco.yml"
    assert type(w.model.neck).__name__ == "PPYOLOTinyFPN" and type(w.model.backbone).__name__ == "MobileNetV3"
    assert w.config["YOLOv3Head"]["anchors"][0] == [10, 15]  # tiny's own anchors, from its _base_ file
    assert w.model.yolo_head.yolo_outputs[0].weight.shape[0] == 3 * (3 + 5)  # 3 anchors x (3 classes + 5)


def test_ppyolo_overrides_sync_bn_to_bn_on_cpu_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, logger="ampsafe_lab.workloads.ppyolo"):
        w = build("ppyolo", config="tiny", image_size=128)
    assert w.overrides["norm_type"] == ("sync_bn", "bn") and w.config["norm_type"] == "bn"
    assert "sync_bn -> bn" in caplog.text
    kinds = {type(m).__name__ for m in w.model.sublayers()}
    assert "SyncBatchNorm" not in kinds and "BatchNorm2D" in kinds


def test_ppyolo_targets_come_from_ppdet_gt2yolotarget(det_ppyolo_tiny):
    from ppdet.data.transform.batch_operators import Gt2YoloTarget

    from ampsafe_lab.workloads.shapes import make_samples

    w = det_ppyolo_tiny
    assert any(type(op) is Gt2YoloTarget for op in w.batch_transforms.transforms_cls)
    batch = w.batch(1)
    samples = make_samples(w.seed, 1 * w.batch_size, w.batch_size, image_size=320, num_classes=3)
    n_boxes = sum(len(s.labels) for s in samples)
    positives = sum(int((batch[f"target{i}"][:, :, 5] > 0).sum()) for i in range(3))
    assert positives == n_boxes  # iou_thresh 1.0: each box lands on exactly one anchor cell
    for i, stride in enumerate((32, 16, 8)):
        assert tuple(batch[f"target{i}"].shape) == (2, 3, 6 + 3, 320 // stride, 320 // stride)
    # gt_bbox is normalized centre-xywh, as ppdet's YOLOv3Loss expects
    gt = batch["gt_bbox"].numpy()[0][: len(samples[0].labels)]
    expected = samples[0].boxes
    centre = (expected[:, :2] + expected[:, 2:]) / 2 / 320
    assert np.allclose(gt[:, :2], centre, atol=1e-6)


def test_ppyolo_batches_are_deterministic_and_distinct(det_ppyolo_tiny):
    a, b, c = (det_ppyolo_tiny.batch(s) for s in (5, 5, 6))
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in a)
    assert not np.array_equal(a["image"].numpy(), c["image"].numpy())


def test_ppyolo_r50vd_dcn_has_dcn_and_iou_aware_loss_terms(det_ppyolo_r50):
    w = det_ppyolo_r50
    assert type(w.model.neck).__name__ == "PPYOLOFPN" and w.model.yolo_head.iou_aware
    assert any("Deform" in type(m).__name__ for m in w.model.backbone.sublayers())
    assert w.image_size == 192 and w.batch_size == 2  # reduced from 320-608 px x 24
    terms = w.loss_dict(w.example_inputs[0])
    assert {"loss_xy", "loss_wh", "loss_iou", "loss_iou_aware", "loss_obj", "loss_cls", "loss"} <= set(terms)
    parts = sum(float(v) for k, v in terms.items() if k != "loss")
    assert float(terms["loss"]) == pytest.approx(parts, rel=1e-5)


def test_ppyolo_builds_do_not_leak_config_into_each_other_or_the_registry(det_ppyolo_r50):
    before = _registry_state()
    tiny = build("ppyolo", config="tiny", image_size=128)
    assert not tiny.model.yolo_head.iou_aware and tiny.model.yolo_head.loss.iou_aware_loss is None
    assert "iou_aware" not in tiny.config["YOLOv3Head"]
    assert _registry_state() == before


def test_ppyolo_evaluate_returns_coco_map_and_restores_train_mode(det_ppyolo_tiny):
    metrics = det_ppyolo_tiny.evaluate(n_images=2)
    assert set(metrics) >= {"map", "map50"} and all(0.0 <= v <= 1.0 for v in metrics.values())
    assert det_ppyolo_tiny.model.training


@pytest.mark.slow
def test_ppyolo_tiny_loss_falls_over_20_fp32_steps(det_train, det_falls):
    workload = build("ppyolo", seed=0, config="tiny", image_size=256)
    losses = det_train(workload, lr=2e-4)
    print("ppyolo tiny losses:", [round(v, 2) for v in losses])
    assert np.isfinite(losses).all() and det_falls(losses), losses


@pytest.mark.slow
def test_ppyolo_r50vd_dcn_reduced_loss_falls_over_20_fp32_steps(det_train, det_falls):
    workload = build("ppyolo", seed=0, config="r50vd_dcn")
    losses = det_train(workload, lr=2e-4)
    print("ppyolo r50vd_dcn losses:", [round(v, 2) for v in losses])
    assert np.isfinite(losses).all() and det_falls(losses), losses


def test_ppyolo_missing_config_file_raises_config_error(tmp_path):
    before = _registry_state()
    with pytest.raises(ampsafe.ConfigError, match="not found"):
        build("ppyolo", config=str(tmp_path / "nope.yml"))
    with pytest.raises(ampsafe.ConfigError, match="known name"):
        build("ppyolo", config="ppyolo_huge")
    assert _registry_state() == before


def test_ppyolo_config_without_architecture_raises_config_error(tmp_path, upstream):
    reader = upstream / "PaddleDetection/configs/ppyolo/_base_/ppyolo_tiny_reader.yml"
    no_arch = tmp_path / "no_arch.yml"
    no_arch.write_text(f"_BASE_: ['{reader}']\nnum_classes: 3\n")
    before = _registry_state()
    with pytest.raises(ampsafe.ConfigError, match="no 'architecture' key"):
        build("ppyolo", config=str(no_arch))
    no_section = tmp_path / "no_section.yml"
    no_section.write_text(f"_BASE_: ['{reader}']\narchitecture: YOLOv3\n")
    with pytest.raises(ampsafe.ConfigError, match="no 'YOLOv3:' section"):
        build("ppyolo", config=str(no_section))
    assert _registry_state() == before


def test_ppyolo_without_ppdet_raises_missing_framework_error():
    code = textwrap.dedent(
        """
        import sys
        class _Block:
            def find_spec(self, name, path=None, target=None):
                if name == "ppdet" or name.startswith("ppdet."):
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, _Block())
        import ampsafe
        import ampsafe_lab.workloads
        try:
            ampsafe_lab.workloads.build("ppyolo")
        except ampsafe.errors.MissingFrameworkError as exc:
            print("MISSING:", exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "MISSING:" in out.stdout and "paddledet" in out.stdout, out.stdout + out.stderr


def test_ppyolo_accepts_a_config_path_with_two_output_levels(upstream):
    path = upstream / "PaddleDetection/configs/ppyolo/ppyolo_mbv3_small_coco.yml"
    w = build("ppyolo", config=str(path), image_size=128)
    assert w.config_path == path and len(w.model.yolo_head.yolo_outputs) == 2
    batch = w.batch(0)
    assert {"target0", "target1"} <= set(batch) and "target2" not in batch
    assert np.isfinite(float(w.loss(batch)))
