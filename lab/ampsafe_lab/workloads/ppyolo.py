"""``ppyolo``: PP-YOLO built by PaddleDetection's own registry from the upstream configs (Paddle).

The PP-YOLO seed report is ``loss=nan`` training ``ppyolo_r50vd_dcn_1x_coco.yml``. The model comes from
``ppdet.core.workspace.load_config`` + ``create(cfg.architecture)`` on the unmodified upstream config; the
targets from ppdet's own batch operators (``NormalizeBox``, ``PadBox``, ``BboxXYXY2XYWH``, ``NormalizeImage``,
``Permute``, ``Gt2YoloTarget``) as listed in the config's ``TrainReader``, applied to synthetic shapes; the loss
is the model's own ``YOLOv3Loss`` (with its IoU and IoU-aware terms when the config has them).

ppdet keeps one process-wide config (``global_config``) that every ``load_config`` merges into. Each build
here starts from a clean registry and puts the previous state back afterwards, so building ``tiny`` and then
``r50vd_dcn`` gives exactly what each config says, and other users of the registry see no change.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from pathlib import Path

from ampsafe._framework import require
from ampsafe.errors import ConfigError, MissingFrameworkError

from .base import Workload
from .coco import held_out_map
from .shapes import MAX_CLASSES, make_samples
from .upstream import upstream_root

__all__ = ["PPYOLOWorkload", "build", "CONFIGS", "upstream_dir"]

log = logging.getLogger(__name__)

# name -> (config path inside the PaddleDetection upstream copy, default image size, default batch size)
CONFIGS = {
    "tiny": ("configs/ppyolo/ppyolo_tiny_650e_coco.yml", 320, 2),
    "r50vd_dcn": ("dygraph/configs/ppyolo/ppyolo_r50vd_dcn_1x_coco.yml", 192, 2),
    "mbv3_small": ("configs/ppyolo/ppyolo_mbv3_small_coco.yml", 320, 2),
}
# batch operators that only add randomness (the synthetic images are generated at the final size)
_SKIPPED_BATCH_OPS = {"BatchRandomResize"}
_IMAGE_OPS = {"NormalizeImage", "Permute"}


def upstream_dir() -> Path:
    """The PaddleDetection configs copy: the package's (``ampsafe_lab/workloads/data/upstream/PaddleDetection``, the
    ``_BASE_`` chains of :data:`CONFIGS`) or, when ``AMPSAFE_SHARED`` is set, ``$AMPSAFE_SHARED/upstream/...``."""
    return upstream_root() / "PaddleDetection"


def _ppdet():
    require("paddle")
    try:
        import ppdet.core.workspace as workspace
        from ppdet.core.config.schema import SchemaDict
    except ImportError as exc:
        raise MissingFrameworkError(
            "the ppyolo workload needs PaddleDetection: pip install paddledet==2.6.0 --no-deps plus its runtime "
            "needs (scipy, scikit-learn, matplotlib, pycocotools, pyyaml, shapely, tqdm, six, pandas, requests); "
            "or pip install 'ampsafe[det]'"
        ) from exc
    return workspace, SchemaDict


@contextlib.contextmanager
def _clean_registry(workspace, schema_dict):
    """Run with ppdet's ``global_config`` emptied of loaded settings (registrations kept); restore it after."""
    g = workspace.global_config
    saved = dict(g)
    saved_items = {}
    for key, value in saved.items():
        if isinstance(value, schema_dict):
            try:
                saved_items[key] = copy.deepcopy(dict(value))
            except Exception:  # an item that cannot be deep-copied (e.g. a live object): keep a shallow copy
                saved_items[key] = dict(value)
    for key in list(g):
        if isinstance(g[key], schema_dict):
            dict.clear(g[key])
        else:
            del g[key]
    try:
        yield g
    finally:
        g.clear()
        g.update(saved)
        for key, items in saved_items.items():
            dict.clear(saved[key])
            dict.update(saved[key], items)


def _plain(cfg, schema_dict) -> dict:
    """A detached, plain-dict copy of the resolved config (loaded settings only)."""
    out = {}
    for key, value in cfg.items():
        if isinstance(value, schema_dict):
            if len(value):
                out[key] = copy.deepcopy(dict(value))
        else:
            try:
                out[key] = copy.deepcopy(value)
            except Exception:
                out[key] = value
    return out


def _resolve_path(config) -> Path:
    if isinstance(config, str) and config in CONFIGS:
        return upstream_dir() / CONFIGS[config][0]
    path = Path(config)
    if path.suffix not in (".yml", ".yaml"):
        raise ConfigError(
            f"ppyolo config {config!r} is neither a known name ({', '.join(CONFIGS)}) nor a .yml path; "
            "pass one of those names or the path of a PaddleDetection YOLOv3/PP-YOLO config"
        )
    return path


def _cpu_only() -> bool:
    paddle = require("paddle")
    return not paddle.is_compiled_with_cuda() or paddle.get_device().startswith("cpu")


class PPYOLOWorkload(Workload):
    """PP-YOLO (ppdet ``YOLOv3`` architecture) on synthetic shapes.

    ``example_inputs`` = ``(inputs,)``: the ppdet input dict (``image``, ``im_shape``, ``scale_factor``,
    ``gt_bbox``, ``target0..``) for ``model(inputs)``, which returns the loss dict in train mode.
    ``config`` is the resolved config (plain dicts), ``config_path`` its file, ``overrides`` what was changed
    from it (key -> (old, new)), ``batch_transforms`` the ppdet operators that make the targets.
    """

    name = "ppyolo"
    framework = "paddle"

    def __init__(
        self, model, *, seed, config, config_path, overrides, batch_transforms, image_size, batch_size, max_objects=4
    ):
        self.config = config
        self.config_path = config_path
        self.overrides = overrides
        self.batch_transforms = batch_transforms
        self.image_size = image_size
        self.batch_size = batch_size
        self.num_classes = config["num_classes"]
        self.sample_options = {"image_size": image_size, "num_classes": self.num_classes, "max_objects": max_objects}
        super().__init__(model, (), seed=seed)
        self.example_inputs = (self.batch(0),)

    def _samples_to_ppdet(self, samples) -> list[dict]:
        import numpy as np

        size = self.image_size
        return [
            {
                "image": s.image.astype(np.float32),
                "gt_bbox": s.boxes.copy(),
                "gt_class": s.labels.astype(np.int32).reshape(-1, 1),
                "im_shape": np.array([size, size], np.float32),
                "scale_factor": np.array([1.0, 1.0], np.float32),
            }
            for s in samples
        ]

    def batch(self, step: int) -> dict:
        """The ppdet input dict of batch ``step`` (paddle tensors), targets made by ppdet's ``Gt2YoloTarget``."""
        paddle = require("paddle")
        samples = make_samples(self.seed, step * self.batch_size, self.batch_size, **self.sample_options)
        arrays = self.batch_transforms(self._samples_to_ppdet(samples))
        return {key: paddle.to_tensor(value) for key, value in arrays.items()}

    def loss_dict(self, batch: dict) -> dict:
        """The model's own loss dict (``loss_xy``, ``loss_wh``, ``loss_iou``, [``loss_iou_aware``], ``loss_obj``,
        ``loss_cls``, ``loss``). ppdet keeps a reference to its inputs, so it gets a shallow copy."""
        return self.model(dict(batch))

    def loss(self, batch: dict):
        return self.loss_dict(batch)["loss"]

    def make_optimizer(self, lr: float):
        """Momentum 0.9 with L2 decay 5e-4, as the PP-YOLO configs' ``OptimizerBuilder`` (per-parameter decay,
        e.g. none on norms, is kept by Paddle)."""
        paddle = require("paddle")
        return paddle.optimizer.Momentum(
            learning_rate=lr,
            momentum=0.9,
            parameters=self.model.parameters(),
            weight_decay=paddle.regularizer.L2Decay(5e-4),
        )

    def evaluate(self, n_images: int = 8, batch_size: int = 4) -> dict:
        """COCO mAP of the model's own post-process (decode + NMS) on held-out images; train mode is restored."""
        import numpy as np

        paddle = require("paddle")
        from ppdet.data.reader import BatchCompose

        # the same ppdet image operators as training (NormalizeImage, Permute), nothing that needs boxes
        image_ops = BatchCompose(
            [op for op in self.batch_transforms.transforms if next(iter(op)) in _IMAGE_OPS], collate_batch=True
        )

        def predict(samples) -> list[dict]:
            chunk = self._samples_to_ppdet(samples)
            for sample in chunk:  # ground truth stays out of the model's inputs
                del sample["gt_bbox"], sample["gt_class"]
            arrays = image_ops(chunk)
            out = self.model({key: paddle.to_tensor(value) for key, value in arrays.items()})
            bbox, counts = out["bbox"].numpy(), out["bbox_num"].numpy()
            preds, start = [], 0
            for n in counts:
                rows = bbox[start : start + int(n)]
                rows = rows[rows[:, 0] >= 0]  # ppdet pads "no detection" with class -1
                preds.append({"labels": rows[:, 0].astype(np.int64), "scores": rows[:, 1], "boxes": rows[:, 2:6]})
                start += int(n)
            return preds

        return held_out_map(self, predict, n_images=n_images, batch_size=batch_size)


def _batch_transform_list(cfg) -> list[dict]:
    """The config's ``TrainReader.batch_transforms`` minus random resizing; ``Gt2YoloTarget`` derived from the
    head when the reader lacks it."""
    reader = cfg.get("TrainReader") or {}
    ops = []
    for item in reader.get("batch_transforms") or []:
        ((name, args),) = item.items()
        if name in _SKIPPED_BATCH_OPS:
            continue
        ops.append({name: dict(args or {})})
    names = [next(iter(op)) for op in ops]
    if "Gt2YoloTarget" not in names:
        head, loss = cfg["YOLOv3Head"], cfg["YOLOv3Loss"]
        ops = [
            {"NormalizeBox": {}},
            {"PadBox": {"num_max_boxes": 50}},
            {"BboxXYXY2XYWH": {}},
            {"NormalizeImage": {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "is_scale": True}},
            {"Permute": {}},
            {
                "Gt2YoloTarget": {
                    "anchors": head["anchors"],
                    "anchor_masks": head["anchor_masks"],
                    "downsample_ratios": loss["downsample"],
                }
            },
        ]
    return ops


def build(
    *,
    seed: int = 0,
    config: str = "tiny",
    image_size: int | None = None,
    batch_size: int | None = None,
    num_classes: int = 3,
    norm_type: str | None = None,
    max_objects: int = 4,
) -> PPYOLOWorkload:
    """PP-YOLO from ``config`` ("tiny", "r50vd_dcn", "mbv3_small" or a PaddleDetection .yml path), seeded.

    ``image_size`` (a multiple of 32) and ``batch_size`` default per config: tiny 320 px x 2; r50vd_dcn reduced
    to 192 px x 2 (the config trains at 320-608 px x 24). ``num_classes`` replaces COCO's 80. ``norm_type``
    defaults to the config's, except that ``sync_bn`` becomes ``bn`` on a CPU-only Paddle (no CPU kernel).
    """
    paddle = require("paddle")
    workspace, schema_dict = _ppdet()
    import numpy as np
    from ppdet.data.reader import BatchCompose

    path = _resolve_path(config)
    if not path.is_file():
        raise ConfigError(
            f"ppyolo config file not found: {path}; pass config='tiny'|'r50vd_dcn'|'mbv3_small' (resolved under "
            f"{upstream_dir()}, set AMPSAFE_SHARED to move it) or the path of an existing PaddleDetection .yml"
        )
    defaults = CONFIGS.get(config) if isinstance(config, str) else None
    default_size, default_batch = (defaults[1], defaults[2]) if defaults else (320, 2)
    image_size = int(image_size or default_size)
    batch_size = int(batch_size or default_batch)
    if image_size % 32 or image_size < 64:
        raise ConfigError(f"ppyolo image_size must be a multiple of 32 and >= 64, got {image_size}")
    if not 1 <= num_classes <= MAX_CLASSES:
        raise ConfigError(f"ppyolo num_classes must be in 1..{MAX_CLASSES} (the shapes dataset), got {num_classes}")

    with _clean_registry(workspace, schema_dict) as cfg:
        try:
            workspace.load_config(str(path))
        except (OSError, ValueError, TypeError, AssertionError, KeyError) as exc:
            raise ConfigError(f"could not load ppyolo config {path}: {exc}; fix the file or its _BASE_ chain") from exc
        except Exception as exc:  # yaml errors
            raise ConfigError(f"could not parse ppyolo config {path}: {exc}") from exc
        arch = cfg.get("architecture")
        if not arch:
            raise ConfigError(
                f"{path} has no 'architecture' key (nor in its _BASE_ files); add e.g. 'architecture: YOLOv3' "
                "and a 'YOLOv3:' section naming backbone, neck and yolo_head"
            )
        if arch != "YOLOv3":
            raise ConfigError(
                f"{path} builds architecture {arch!r}; the ppyolo workload needs 'YOLOv3' (PP-YOLO, PP-YOLO tiny, "
                "YOLOv3), whose targets come from Gt2YoloTarget"
            )
        if not isinstance(cfg.get(arch), schema_dict) or not len(cfg[arch]):
            raise ConfigError(
                f"{path} sets 'architecture: {arch}' but has no '{arch}:' section (nor in its _BASE_ files); add "
                f"one naming backbone, neck, yolo_head and post_process, as configs/ppyolo/_base_/ppyolo_tiny.yml does"
            )

        overrides = {}
        old_norm = cfg.get("norm_type", "bn")
        new_norm = norm_type or ("bn" if old_norm == "sync_bn" and _cpu_only() else old_norm)
        if new_norm != old_norm:
            overrides["norm_type"] = (old_norm, new_norm)
            if norm_type is None:
                log.warning("ppyolo: norm_type sync_bn -> bn (sync_batch_norm has no CPU kernel in Paddle)")
        overrides["num_classes"] = (cfg.get("num_classes", 80), num_classes)
        cfg["norm_type"] = new_norm
        cfg["num_classes"] = num_classes

        paddle.seed(seed)
        np.random.seed(seed)
        try:
            model = workspace.create(arch)
        except (ValueError, KeyError, TypeError, AssertionError) as exc:
            raise ConfigError(f"ppdet could not build {arch!r} from {path}: {exc}") from exc
        ops = _batch_transform_list(cfg)
        resolved = _plain(cfg, schema_dict)
    model.train()
    transforms = BatchCompose(ops, num_classes=num_classes, collate_batch=True)
    return PPYOLOWorkload(
        model,
        seed=seed,
        config=resolved,
        config_path=path,
        overrides=overrides,
        batch_transforms=transforms,
        image_size=image_size,
        batch_size=batch_size,
        max_objects=max_objects,
    )
