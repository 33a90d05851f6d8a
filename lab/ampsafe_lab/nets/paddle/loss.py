"""DBLoss from a PaddleOCR ``Loss`` section: alpha * balanced shrink loss + beta * masked L1 + binary dice."""

from __future__ import annotations

import paddle
import paddle.nn.functional as F
from paddle import nn

__all__ = ["DBLoss", "BalanceLoss", "DiceLoss", "MaskL1Loss", "BCELoss"]


class DiceLoss(nn.Layer):
    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, pred, gt, mask, weights=None):
        if weights is not None:
            mask = weights * mask
        intersection = paddle.sum(pred * gt * mask)
        union = paddle.sum(pred * mask) + paddle.sum(gt * mask) + self.eps
        return 1 - 2.0 * intersection / union


class MaskL1Loss(nn.Layer):
    def __init__(self, eps: float = 1e-6):
        super().__init__()
        self.eps = eps

    def forward(self, pred, gt, mask):
        return (paddle.abs(pred - gt) * mask).sum() / (mask.sum() + self.eps)


class BCELoss(nn.Layer):
    """Per-pixel binary cross-entropy (``reduction="none"`` inside BalanceLoss, so OHEM can rank pixels)."""

    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, pred, gt, mask=None):
        return F.binary_cross_entropy(pred, gt, reduction=self.reduction)


class BalanceLoss(nn.Layer):
    """Online hard negative mining: all positives plus the ``negative_ratio`` x as many hardest negatives."""

    def __init__(self, balance_loss=True, main_loss_type="DiceLoss", negative_ratio=3, eps=1e-6, **_ignored):
        super().__init__()
        self.balance_loss = balance_loss
        self.negative_ratio = negative_ratio
        self.eps = eps
        losses = {
            "DiceLoss": lambda: DiceLoss(eps),
            "BCELoss": lambda: BCELoss(reduction="none"),
            "MaskL1Loss": lambda: MaskL1Loss(eps),
        }
        if main_loss_type not in losses:
            raise ValueError(f"main_loss_type must be one of {sorted(losses)}, got {main_loss_type!r}")
        self.loss = losses[main_loss_type]()

    def forward(self, pred, gt, mask):
        positive = gt * mask
        negative = (1 - gt) * mask
        positive_count = int(positive.sum())
        negative_count = int(min(float(negative.sum()), positive_count * self.negative_ratio))
        loss = self.loss(pred, gt, mask=mask)
        if not self.balance_loss:
            return loss
        positive_loss = positive * loss
        negative_loss = paddle.reshape(negative * loss, [-1])
        if negative_count > 0:
            hardest = paddle.sort(negative_loss, descending=True)[:negative_count]
            return (positive_loss.sum() + hardest.sum()) / (positive_count + negative_count + self.eps)
        return positive_loss.sum() / (positive_count + self.eps)


class DBLoss(nn.Layer):
    """``forward(predicts, labels)``: predicts ``{"maps": (N,3,H,W)}``; labels ``[image, threshold_map,
    threshold_mask, shrink_map, shrink_mask]``. Returns the term dict PaddleOCR logs (``loss`` is the total)."""

    def __init__(
        self, balance_loss=True, main_loss_type="DiceLoss", alpha=5, beta=10, ohem_ratio=3, eps=1e-6, **_ignored
    ):
        super().__init__()
        self.alpha = alpha
        self.beta = beta
        self.dice_loss = DiceLoss(eps)
        self.l1_loss = MaskL1Loss(eps)
        self.bce_loss = BalanceLoss(balance_loss, main_loss_type, ohem_ratio, eps)

    def forward(self, predicts, labels):
        maps = predicts["maps"]
        threshold_map, threshold_mask, shrink_map, shrink_mask = labels[1:5]
        shrink, threshold, binary = maps[:, 0, :, :], maps[:, 1, :, :], maps[:, 2, :, :]
        loss_shrink = self.alpha * self.bce_loss(shrink, shrink_map, shrink_mask)
        loss_threshold = self.beta * self.l1_loss(threshold, threshold_map, threshold_mask)
        loss_binary = self.dice_loss(binary, shrink_map, shrink_mask)
        loss_cbn = paddle.zeros([], dtype=maps.dtype)
        return {
            "loss": loss_shrink + loss_threshold + loss_binary + loss_cbn,
            "loss_shrink_maps": loss_shrink,
            "loss_threshold_maps": loss_threshold,
            "loss_binary_maps": loss_binary,
            "loss_cbn": loss_cbn,
        }
