"""PaddleOCR's TableMaster head (``ppocr/modeling/heads/table_master_head.py``, the unmodified tree in
``shared/upstream/PaddleOCR-src`` or ``$PADDLEOCR_SRC``) as ``configs/table/table_master.yml`` builds it: 500
structure tokens decoded teacher-forced in training, each self-attention filling its masked scores with -6.55e4
"for fp16" (``x * ~mask + mask * -6.55e4``, an additive mask at float16's edge) before the softmax.

That fill is what the mask means, not a value near overflow: no risky path or op at O1 or O2 (counted as a value, it
made all four self-attentions risky at 65500). A real overflow of the same scores is still found at their matmul.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

paddle = pytest.importorskip("paddle")

import ampsafe  # noqa: E402
from bench.zoo_ppocr import table_master_targets  # noqa: E402

STRUCTURE_TOKENS = 39  # ppocr/utils/dict/table_master_structure_dict.txt; the head adds SOS, EOS and PAD
SELF_ATTN = "layers.0.self_attn"


@pytest.fixture(scope="module")
def head_and_inputs(paddleocr_src):
    import yaml

    sys.path.insert(0, str(paddleocr_src))
    try:
        from ppocr.modeling.heads import build_head

        config = yaml.safe_load((paddleocr_src / "configs/table/table_master.yml").read_text())
        settings = {**config["Architecture"]["Head"], "in_channels": [512], "out_channels": STRUCTURE_TOKENS + 3}
        paddle.seed(0)
        head = build_head(settings)
    finally:
        sys.path.remove(str(paddleocr_src))
    head.train()
    rng = np.random.default_rng(0)
    (tokens,), _ = table_master_targets(head, rng)  # the zoo scan's: SOS, 200 tokens, EOS, PAD up to 500
    feature = paddle.to_tensor(rng.uniform(-1, 1, (2, 512, 8, 8)).astype("float32"))  # the backbone's last map
    return head, ([feature], [tokens])


def n_self_attentions(head) -> int:
    return sum(1 for name, _ in head.named_sublayers() if name.endswith("self_attn"))


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_table_masters_fp16_mask_fill_is_no_risk(head_and_inputs, level):
    head, inputs = head_and_inputs
    assert n_self_attentions(head) == 4 and head.max_text_length == 500
    report = ampsafe.scan(head, inputs, level=level)
    assert report.risky == [] and report.risky_ops == [], report.to_markdown()
    attention = report.path(SELF_ATTN)
    assert any(op.endswith(":softmax") for op in attention.ops) and 0 < attention.amax < 1e3, attention


def test_a_real_self_attention_overflow_is_found_beside_table_masters_mask(head_and_inputs):
    head, inputs = head_and_inputs
    layers = dict(head.named_sublayers())
    saved = {p: layers[p].weight.numpy().copy() for p in (f"{SELF_ATTN}.linears.0", f"{SELF_ATTN}.linears.1")}
    try:
        with paddle.no_grad():
            for path in saved:  # query and key 100 times larger: the scores 1e4 times, past 65504
                layers[path].weight.set_value(layers[path].weight * 100.0)
        report = ampsafe.scan(head, inputs)
    finally:
        for path, value in saved.items():
            layers[path].weight.set_value(value)
    attention = report.path(SELF_ATTN)
    assert attention.risky and 65504 < attention.amax < 1e30 and attention.overflows_in == "forward", attention
