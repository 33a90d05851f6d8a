"""The dbnet Workload contract: deterministic batches, scalar loss, Adam without decay, evaluate(), training."""

from __future__ import annotations

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

from ampsafe.errors import ConfigError  # noqa: E402
from ampsafe_lab.workloads import build  # noqa: E402


@pytest.fixture(scope="module")
def dbnet_small():
    return build("dbnet", seed=0, image_size=64, batch_size=2)


def test_build_returns_a_paddle_workload_in_train_mode(dbnet_small):
    w = dbnet_small
    assert w.framework == "paddle" and w.name == "dbnet" and w.model.training
    assert isinstance(w.model, paddle.nn.Layer)
    (image,) = w.example_inputs
    assert image.shape == [2, 3, 64, 64]
    assert w.model(*w.example_inputs)["maps"].shape == [2, 3, 64, 64]


def test_same_seed_same_weights_and_batches():
    a = build("dbnet", seed=1, image_size=64, batch_size=2)
    b = build("dbnet", seed=1, image_size=64, batch_size=2)
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=name)
    for x, y in zip(a.batch(4), b.batch(4)):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    assert not np.array_equal(a.batch(4)[0].numpy(), a.batch(5)[0].numpy())


def test_loss_is_a_finite_scalar_with_gradients(dbnet_small):
    w = dbnet_small
    loss = w.loss(w.batch(0))
    assert loss.shape == [] and np.isfinite(float(loss))
    loss.backward()
    grad = w.model.head.binarize.conv1.weight.grad
    assert grad is not None and float(grad.abs().sum()) > 0
    w.model.clear_gradients()
    terms = w.loss_terms(w.batch(0))
    total = sum(float(terms[k]) for k in ("loss_shrink_maps", "loss_threshold_maps", "loss_binary_maps"))
    assert float(terms["loss"]) == pytest.approx(total, rel=1e-6)


def test_optimizer_is_adam_without_weight_decay(dbnet_small):
    opt = dbnet_small.make_optimizer(1e-3)
    assert isinstance(opt, paddle.optimizer.Adam)
    assert opt.get_lr() == pytest.approx(1e-3)
    assert opt.regularization is None


def test_evaluate_reports_hmean_precision_recall_and_keeps_train_mode(dbnet_small):
    result = dbnet_small.evaluate(n_images=4)
    assert {"hmean", "precision", "recall"} <= set(result)
    assert result["labels"] > 0 and 0.0 <= result["hmean"] <= 1.0
    assert dbnet_small.model.training


@pytest.mark.parametrize("options", [{"image_size": 100}, {"image_size": 16}, {"batch_size": 0}, {"colour": 1}])
def test_bad_sizes_raise_config_error(options):
    with pytest.raises(ConfigError):
        build("dbnet", **options)


@pytest.mark.slow
def test_twenty_fp32_steps_on_distinct_batches_lower_the_loss():
    w = build("dbnet", seed=0)  # 128x128, batch 8: the recipe
    optimizer = w.make_optimizer(1e-3)
    losses = []
    for step in range(20):
        loss = w.loss(w.batch(step))
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        losses.append(float(loss))
    assert all(np.isfinite(losses))
    first, last = np.mean(losses[:5]), np.mean(losses[-5:])
    assert last <= 0.8 * first, losses


def test_bce_main_loss_keeps_positives_and_three_times_as_many_hardest_negatives():
    from ampsafe_lab.nets.paddle.loss import BalanceLoss

    rng = np.random.default_rng(0)
    pred = rng.uniform(0.01, 0.99, size=(2, 16, 16)).astype(np.float32)
    gt = np.zeros((2, 16, 16), np.float32)
    gt[:, 4:8, 4:10] = 1  # 48 positives, 464 negatives -> keep the 144 hardest
    mask = np.ones_like(gt)
    loss = BalanceLoss(main_loss_type="BCELoss", negative_ratio=3)(*(paddle.to_tensor(a) for a in (pred, gt, mask)))
    bce = -(gt * np.log(pred) + (1 - gt) * np.log(1 - pred))
    hardest = np.sort(bce[gt == 0])[::-1][: 3 * int(gt.sum())]
    expected = (bce[gt == 1].sum() + hardest.sum()) / (gt.sum() + hardest.size + 1e-6)
    assert float(loss) == pytest.approx(expected, rel=1e-5)
