"""The AMP-safe PaddleOCR necks: upstream-compatible keys, buildable at the configs' channel counts, and no
float16 overflow where the upstream neck overflows (emulated float16, synthetic feature pyramid)."""

from __future__ import annotations

import paddle
import pytest
from paddle import nn

from ampsafe.patches import paddleocr_necks as necks

# backbone -> the four channel counts it hands the neck (PaddleOCR det backbones, as in the upstream configs)
PYRAMIDS = {
    "MobileNetV3 large x0.5": [16, 24, 56, 480],  # ch_PP-OCRv3 student / cml students, det_mv3_db
    "PPLCNetV3 x0.75": [12, 18, 42, 360],  # PP-OCRv4/v5 mobile, ch_PP-OCRv4 student
    "PPHGNet_small": [256, 512, 768, 1024],  # PP-OCRv4 server, ch_PP-OCRv4 teacher
    "PPHGNetV2_B4": [128, 512, 1024, 2048],  # PP-OCRv5 server
    "ResNet_vd 50": [256, 512, 1024, 2048],  # ch_PP-OCRv3 cml teacher, det_r50_vd_db
}
# (upstream, safe, backbone, config options) as the upstream configs use them
CASES = [
    (necks.DBFPN, necks.AmpSafeDBFPN, "MobileNetV3 large x0.5", {"out_channels": 256}),
    (necks.RSEFPN, necks.AmpSafeRSEFPN, "MobileNetV3 large x0.5", {"out_channels": 96, "shortcut": True}),
    (necks.RSEFPN, necks.AmpSafeRSEFPN, "PPLCNetV3 x0.75", {"out_channels": 96, "shortcut": True}),
    (necks.LKPAN, necks.AmpSafeLKPAN, "ResNet_vd 50", {"out_channels": 256}),
    (necks.LKPAN, necks.AmpSafeLKPAN, "PPHGNet_small", {"out_channels": 256, "intracl": True}),
    (necks.LKPAN, necks.AmpSafeLKPAN, "PPHGNetV2_B4", {"out_channels": 256, "intracl": True}),
]
IDS = [f"{up.__name__}-{bb}-{'intracl' if o.get('intracl') else 'plain'}" for up, _, bb, o in CASES]


def pyramid(channels, size=32, batch=2, amplitude=4.0, seed=0):
    paddle.seed(seed)
    return [paddle.randn([batch, c, size // 2**i, size // 2**i]) * amplitude for i, c in enumerate(channels)]


class NeckThenHeadConv(nn.Layer):
    """The neck followed by the first conv + BN of a DB head: the measured overflow happens in that conv."""

    def __init__(self, neck):
        super().__init__()
        self.neck = neck
        self.head_conv = nn.Conv2D(neck.out_channels, neck.out_channels // 4, 3, padding=1, bias_attr=False)
        self.head_bn = nn.BatchNorm2D(neck.out_channels // 4)

    def forward(self, features):
        return self.head_bn(self.head_conv(self.neck(features)))


def grow_conv_weights(model, factor):
    """What a high learning rate does to unnormalized weights over training: every conv kernel x ``factor``."""
    for param in model.parameters():
        if param.ndim == 4:
            param.set_value(param * factor)


def overflows_under_fp16(neck, channels, factor=16.0) -> bool:
    from ampsafe.paddle import emulate_fp16

    model = NeckThenHeadConv(neck)
    grow_conv_weights(model, factor)
    with emulate_fp16(model):
        out = model(pyramid(channels))
        out.mean().backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return not (bool(paddle.isfinite(out).all()) and all(bool(paddle.isfinite(g).all()) for g in grads))


@pytest.mark.parametrize("upstream_cls, safe_cls, backbone, options", CASES, ids=IDS)
def test_safe_neck_builds_and_matches_upstream_keys_plus_batchnorms(upstream_cls, safe_cls, backbone, options):
    channels = PYRAMIDS[backbone]
    paddle.seed(0)
    upstream, safe = upstream_cls(channels, **options), safe_cls(channels, **options)
    out = safe(pyramid(channels))
    assert out.shape == [2, options["out_channels"], 32, 32]
    up_keys, safe_keys = set(upstream.state_dict()), set(safe.state_dict())
    assert up_keys < safe_keys
    new = safe_keys - up_keys
    assert new and all(k.rsplit(".", 1)[-1] in {"weight", "bias", "_mean", "_variance"} and "bn" in k for k in new)
    # an upstream checkpoint loads with only the new BatchNorm keys missing, every upstream tensor taken
    missing, unexpected = safe.set_state_dict(upstream.state_dict())
    assert set(missing) == new and not unexpected
    for key, value in upstream.state_dict().items():
        assert bool((safe.state_dict()[key] == value).all()), key


@pytest.mark.parametrize("upstream_cls, safe_cls, backbone, options", CASES, ids=IDS)
def test_safe_neck_has_no_fp16_overflow_where_upstream_overflows(upstream_cls, safe_cls, backbone, options):
    channels = PYRAMIDS[backbone]
    paddle.seed(0)
    assert overflows_under_fp16(upstream_cls(channels, **options), channels)
    paddle.seed(0)
    assert not overflows_under_fp16(safe_cls(channels, **options), channels)


def test_upstream_compatible_necks_compute_upstream_topology():
    # the safe variant with identity BatchNorms (eval, fresh statistics) computes exactly the upstream neck
    channels = PYRAMIDS["PPLCNetV3 x0.75"]
    paddle.seed(0)
    upstream = necks.LKPAN(channels, 64, intracl=True)
    safe = necks.AmpSafeLKPAN(channels, 64, intracl=True)
    safe.set_state_dict(upstream.state_dict())
    upstream.eval(), safe.eval()
    feats = pyramid(channels, amplitude=1.0)
    expected, got = upstream(feats), safe(feats)
    scale = float(expected.abs().max())
    assert scale > 0 and float((expected - got).abs().max()) / scale < 1e-3


def test_lite_lkpan_builds_with_dsconv():
    neck = necks.AmpSafeLKPAN(PYRAMIDS["ResNet_vd 50"], 128, mode="lite")
    assert isinstance(neck.inp_conv[0], necks.DSConv)
    assert neck(pyramid(PYRAMIDS["ResNet_vd 50"], size=16)).shape == [2, 128, 16, 16]
    with pytest.raises(ValueError, match="mode can only be one of"):
        necks.LKPAN([8, 8, 8, 8], 32, mode="tiny")


def test_safe_dbfpn_supports_db_plus_plus_asf():
    neck = necks.AmpSafeDBFPN(PYRAMIDS["ResNet_vd 50"], 256, use_asf=True)
    assert neck(pyramid(PYRAMIDS["ResNet_vd 50"], size=16)).shape == [2, 256, 16, 16]
    assert "asf.conv.weight" in neck.state_dict()


@pytest.mark.parametrize("name", ["paddleocr_necks", "ppdet_necks"])
def test_patches_neck_modules_name_the_classes_defined_in_the_paddle_package(name):
    import importlib

    named = importlib.import_module(f"ampsafe.patches.{name}")
    defined = importlib.import_module(f"ampsafe.paddle.nets.{name}")
    assert named.__all__ == defined.__all__
    assert all(getattr(named, n) is getattr(defined, n) for n in defined.__all__)
    with pytest.raises(AttributeError, match="has no attribute '_private'"):
        named._private  # noqa: B018 (private names are not forwarded)
