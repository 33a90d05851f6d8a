"""The ``dbnet`` workload: PaddleOCR's DBNet (det_mv3_db by default) rebuilt here, on synthetic text images.

    w = ampsafe_lab.workloads.build("dbnet", seed=0)             # config=, image_size=128, batch_size=8
    loss = w.loss(w.batch(0)); loss.backward()
    w.evaluate(n_images=64)                                    # {"hmean", "precision", "recall", ...}

The network is PaddleOCR's, parameter for parameter (state_dict keys, shapes and outputs match PaddleOCR's own
reference run), so what ampsafe finds and fixes here is what a PaddleOCR user sees. ``brink`` holds the FP32
checkpoint whose activations have just left float16's range.

The network itself is Paddle code and lives in :mod:`ampsafe.paddle.nets` (``dbnet``: the registries and
``build_model`` / ``build_loss``; ``backbones``, ``heads``, ``loss``, ``paddleocr_necks``). Its names are
re-exported here and resolve on first use, so importing this package does not import paddle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Union

from ampsafe._lazy import lazy_attributes
from ampsafe.errors import ConfigError

from ..base import Workload
from .config import load_config

__all__ = [
    "DBNetWorkload",
    "build",
    "build_model",
    "build_loss",
    "register_neck",
    "register_backbone",
    "register_head",
    "BACKBONES",
    "NECKS",
    "HEADS",
    "DBNet",
]


# names defined by ampsafe_lab.nets.paddle.dbnet, read from there on first use (see __getattr__)
_NETS = (
    "BACKBONES",
    "NECKS",
    "HEADS",
    "DBNet",
    "build_model",
    "build_loss",
    "register_backbone",
    "register_neck",
    "register_head",
)


__getattr__, __dir__ = lazy_attributes(__name__, "ampsafe_lab.nets.paddle.dbnet", _NETS)


class DBNetWorkload(Workload):
    """``batch(step)`` is PaddleOCR's KeepKeys list ``[image, threshold_map, threshold_mask, shrink_map,
    shrink_mask]`` of paddle tensors; ``loss(batch)`` runs the model and returns DBLoss's total (0-d)."""

    name = "dbnet"
    framework = "paddle"

    def __init__(self, model, loss_fn, config: dict, *, seed: int, image_size: int, batch_size: int):
        self.config = config
        self.loss_fn = loss_fn
        self.image_size = image_size
        self.batch_size = batch_size
        super().__init__(model, (), seed=seed)
        self.example_inputs = (self.batch(0)[0],)

    def batch_arrays(self, step: int, *, held_out: bool = False) -> dict:
        """The numpy batch (KeepKeys fields + ``polys``); ``held_out`` draws from the evaluation stream."""
        from .data import EVAL_STREAM, TRAIN_STREAM, make_batch

        stream = EVAL_STREAM if held_out else TRAIN_STREAM
        return make_batch(self.seed, step, self.batch_size, self.image_size, stream=stream)

    def batch(self, step: int) -> list:
        import paddle

        from .data import KEEP_KEYS

        arrays = self.batch_arrays(step)
        return [paddle.to_tensor(arrays[key]) for key in KEEP_KEYS]

    def loss_terms(self, batch) -> dict:
        """DBLoss's dict: ``loss``, ``loss_shrink_maps``, ``loss_threshold_maps``, ``loss_binary_maps``, ``loss_cbn``."""
        return self.loss_fn(self.model(batch[0]), batch)

    def loss(self, batch):
        return self.loss_terms(batch)["loss"]

    def make_optimizer(self, lr: float):
        """Adam (beta 0.9 / 0.999) without weight decay, as det_mv3_db.yml (L2 factor 0)."""
        import paddle

        return paddle.optimizer.Adam(learning_rate=lr, parameters=self.model.parameters(), weight_decay=None)

    def predict_boxes(self, images, **postprocess) -> list:
        """Eval-mode forward + DB post-processing; one list of (4, 2) quads per image."""
        import paddle

        from .postprocess import boxes_from_map

        options = {k: v for k, v in self.config.get("PostProcess", {}).items() if k in _POST_KEYS}
        options.update(postprocess)
        with self.evaluating():
            maps = self.model(paddle.to_tensor(images))["maps"].numpy()
        return [boxes_from_map(m[0], **options)[0] for m in maps]

    def evaluate(self, n_images: int = 64, **postprocess) -> dict:
        """Precision, recall and hmean (IoU 0.5) on ``n_images`` held-out synthetic images."""
        from .postprocess import detection_metrics

        predictions, labels = [], []
        for index in range((n_images + self.batch_size - 1) // self.batch_size):
            arrays = self.batch_arrays(index, held_out=True)
            take = min(self.batch_size, n_images - index * self.batch_size)
            predictions += self.predict_boxes(arrays["image"][:take], **postprocess)
            labels += arrays["polys"][:take]
        return detection_metrics(predictions, labels)


_POST_KEYS = ("thresh", "box_thresh", "unclip_ratio", "max_candidates")


def build(
    seed: int = 0,
    *,
    config: Union[str, Path, dict, None] = None,
    image_size: int = 128,
    batch_size: int = 8,
    **unknown,
) -> DBNetWorkload:
    """DBNet from a PaddleOCR config (default det_mv3_db.yml), ``paddle.seed(seed)`` weights, train mode."""
    import paddle

    from ampsafe_lab.nets.paddle.dbnet import build_loss, build_model

    if unknown:
        raise ConfigError(f"unknown dbnet option(s) {sorted(unknown)}; known: config, image_size, batch_size")

    if not isinstance(image_size, int) or image_size < 32 or image_size % 32:
        raise ConfigError(f"image_size must be a multiple of 32 (DB's stride), at least 32; got {image_size!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    cfg = load_config(config)
    paddle.seed(seed)
    model = build_model(cfg["Architecture"])
    model.train()
    return DBNetWorkload(model, build_loss(cfg["Loss"]), cfg, seed=seed, image_size=image_size, batch_size=batch_size)
