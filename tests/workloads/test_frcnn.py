"""The ``frcnn`` workload: torchvision Faster R-CNN (mobilenet_v3 320 FPN) on synthetic shapes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import ampsafe
from ampsafe_lab.workloads import build

torch = pytest.importorskip("torch")


def _same_batch(a, b) -> bool:
    (ia, ta), (ib, tb) = a, b
    return all(torch.equal(x, y) for x, y in zip(ia, ib)) and all(
        torch.equal(x["boxes"], y["boxes"]) and torch.equal(x["labels"], y["labels"]) for x, y in zip(ta, tb)
    )


def test_frcnn_is_torchvision_mobilenet_fasterrcnn_in_train_mode(det_frcnn):
    from torchvision.models.detection import FasterRCNN

    assert det_frcnn.framework == "torch" and isinstance(det_frcnn.model, FasterRCNN)
    assert det_frcnn.model.training
    assert type(det_frcnn.model.backbone.body).__name__ == "IntermediateLayerGetter"
    assert det_frcnn.model.roi_heads.box_predictor.cls_score.out_features == 3 + 1  # shapes + background


def test_frcnn_batches_are_deterministic_and_distinct(det_frcnn):
    assert _same_batch(det_frcnn.batch(3), det_frcnn.batch(3))
    assert not _same_batch(det_frcnn.batch(3), det_frcnn.batch(4))
    images, targets = det_frcnn.batch(0)
    assert len(images) == 2 and images[0].shape == (3, 256, 256) and 0 <= images[0].min() <= images[0].max() <= 1
    assert targets[0]["labels"].min() >= 1  # 0 is torchvision's background


def test_frcnn_loss_is_the_sum_of_torchvision_losses(det_frcnn):
    torch.manual_seed(0)
    terms = det_frcnn.model(*det_frcnn.example_inputs)
    assert set(terms) == {"loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg"}
    torch.manual_seed(0)
    total = det_frcnn.loss(det_frcnn.example_inputs)
    assert total.ndim == 0 and torch.isfinite(total)
    assert total.item() == pytest.approx(sum(t.item() for t in terms.values()), rel=1e-5)


def test_frcnn_evaluate_returns_coco_map_and_restores_train_mode(det_frcnn):
    metrics = det_frcnn.evaluate(n_images=2)
    assert set(metrics) >= {"map", "map50"} and all(0.0 <= v <= 1.0 for v in metrics.values())
    assert det_frcnn.model.training


def test_frcnn_optimizer_is_sgd_momentum(det_frcnn):
    opt = det_frcnn.make_optimizer(0.01)
    assert isinstance(opt, torch.optim.SGD) and opt.defaults["momentum"] == 0.9


@pytest.mark.slow
def test_frcnn_loss_falls_over_20_fp32_steps(det_train, det_falls):
    workload = build("frcnn", seed=0, image_size=256, batch_size=2)
    losses = det_train(workload, lr=0.02)
    print("frcnn losses:", [round(v, 3) for v in losses])
    assert all(map(lambda v: v == v, losses))  # finite (no NaN)
    assert det_falls(losses), losses


def test_frcnn_rejects_unknown_backbone_and_workload_names():
    with pytest.raises(ampsafe.ConfigError, match="backbone"):
        build("frcnn", backbone="vgg")
    with pytest.raises(ampsafe.ConfigError, match="choose one of"):
        build("fasterrcnn")


def test_frcnn_without_torchvision_raises_missing_framework_error():
    code = textwrap.dedent(
        """
        import sys
        class _Block:
            def find_spec(self, name, path=None, target=None):
                if name == "torchvision" or name.startswith("torchvision."):
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, _Block())
        import ampsafe
        import ampsafe_lab.workloads
        try:
            ampsafe_lab.workloads.build("frcnn")
        except ampsafe.errors.MissingFrameworkError as exc:
            print("MISSING:", exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "MISSING:" in out.stdout and "pip install torchvision" in out.stdout, out.stdout + out.stderr
