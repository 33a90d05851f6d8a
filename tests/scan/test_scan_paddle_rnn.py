"""ampsafe.scan through Paddle's fused ``rnn`` kernel (``nn.LSTM``, ``nn.GRU``, ``nn.SimpleRNN``): the scan completes,
records the kernel's first-layer input GEMM as a matmul (measured) whose path ends at the recurrence's bounded
output, and a ReLU RNN's output as an unnormalized matmul output. Then on PaddleOCR's own code: its
``SequenceEncoder(encoder_type='rnn')`` and the CRNN of configs/rec/rec_mv3_none_bilstm_ctc.yml built by
``ppocr.modeling.architectures.build_model``.
"""

from __future__ import annotations

import copy
import sys

import pytest

paddle = pytest.importorskip("paddle")

import numpy as np  # noqa: E402

import ampsafe  # noqa: E402
from ampsafe.core.graph import OpKind  # noqa: E402
from ampsafe.paddle.backend import BACKEND  # noqa: E402
from ampsafe.paddle.trace import trace  # noqa: E402


class ConvRNN(paddle.nn.Layer):
    """A conv feeding a recurrent layer over the width, as a CRNN's backbone feeds its encoder."""

    def __init__(self, rnn):
        super().__init__()
        self.conv = paddle.nn.Conv2D(3, 8, 3, padding=1)
        self.rnn = rnn

    def forward(self, x):
        seq = self.conv(x).mean(axis=2).transpose([0, 2, 1])  # [batch, width, channels]
        out, _ = self.rnn(seq)
        return out


def _nodes(graph, op):
    return [n for n in graph.nodes if n.op == op]


@pytest.mark.parametrize(
    "rnn",
    [
        lambda: paddle.nn.LSTM(8, 6, num_layers=2, direction="bidirect"),
        lambda: paddle.nn.GRU(8, 6),
        lambda: paddle.nn.SimpleRNN(8, 6),  # tanh
    ],
    ids=["lstm", "gru", "tanh-rnn"],
)
def test_an_lstm_or_gru_is_bounded_and_its_input_gemm_is_a_measured_path_that_ends_there(rnn):
    paddle.seed(0)
    model = ConvRNN(rnn())
    model.train()
    x = paddle.rand([2, 3, 4, 10])
    graph = trace(BACKEND, model, (x,))
    (gemm,) = _nodes(graph, "rnn_input_matmul")
    (cell,) = _nodes(graph, "rnn")
    assert gemm.kind is OpKind.MATMUL and cell.kind is OpKind.BOUNDED and gemm.module == cell.module == "rnn"
    assert set(gemm.outputs) <= set(cell.inputs)
    report = ampsafe.scan(model, (x,))
    path = report.path("rnn")
    assert path.start_op == "rnn_input_matmul" and path.normalized and path.ends == ("rnn",) and not path.risky
    conv = report.path("conv")  # the conv's values go into the GEMM: an unnormalized path that ends there
    assert conv.ends == ("rnn",) and not conv.normalized
    assert not any("<output>" in p.ends for p in report.paths)  # the recurrence's output starts no path


def test_the_input_gemm_is_measured_and_flagged_when_it_leaves_float16s_range():
    paddle.seed(0)
    model = ConvRNN(paddle.nn.LSTM(8, 6, direction="bidirect"))
    x = paddle.rand([2, 3, 4, 10])
    seq = model.conv(x).mean(axis=2).transpose([0, 2, 1]).numpy()
    weights = {"weight_ih_l0": 1.0, "weight_ih_l0_reverse": 1e5}  # the reverse direction's GEMM overflows float16
    for name, scale in weights.items():
        getattr(model.rnn, name).set_value(getattr(model.rnn, name) * scale)
    expected = max(
        np.abs(seq @ getattr(model.rnn, w).numpy().T + getattr(model.rnn, b).numpy()).max()
        for w, b in (("weight_ih_l0", "bias_ih_l0"), ("weight_ih_l0_reverse", "bias_ih_l0_reverse"))
    )
    assert expected > 65504
    path = ampsafe.scan(model, (x,)).path("rnn")
    assert path.amax == pytest.approx(expected, rel=1e-3)
    assert path.normalized and path.risky and path.overflows_in == "forward"


def test_a_relu_rnn_output_is_an_unnormalized_matmul_output():
    paddle.seed(0)
    model = ConvRNN(paddle.nn.SimpleRNN(8, 6, activation="relu"))
    report = ampsafe.scan(model, (paddle.rand([2, 3, 4, 10]),))
    (relu_rnn,) = [p for p in report.paths if p.start_op == "rnn"]
    assert relu_rnn.start == "rnn" and relu_rnn.ends == ("<output>",) and not relu_rnn.normalized
    assert report.path("rnn").start_op == "rnn_input_matmul" and report.path("rnn").ends == ("rnn",)


@pytest.fixture(scope="module")
def ppocr(paddleocr_src):
    sys.path.insert(0, str(paddleocr_src))
    try:
        import ppocr.modeling.architectures as architectures
        import ppocr.modeling.necks as necks

        yield architectures, necks
    finally:
        sys.path.remove(str(paddleocr_src))


def _lstm_paths(report, lstm: str):
    """The LSTM's own path, and every path that ends at the LSTM."""
    own = report.path(lstm)
    return own, [p for p in report.paths if lstm in p.ends]


def test_paddleocrs_rnn_sequence_encoder_scans_with_its_lstm_bounded(ppocr):
    _, necks = ppocr
    paddle.seed(0)
    neck = necks.build_neck({"name": "SequenceEncoder", "in_channels": 288, "encoder_type": "rnn", "hidden_size": 48})
    neck.train()
    state = {k: v.numpy().copy() for k, v in neck.state_dict().items()}
    report = ampsafe.scan(neck, (paddle.rand([2, 288, 1, 25]),))
    own, ending = _lstm_paths(report, "encoder.lstm")
    assert own.start_op == "rnn_input_matmul" and own.normalized and own.ends == ("encoder.lstm",)
    assert own.amax and own.amax > 0 and not any(p.risky for p in ending)
    assert [p.start for p in report.paths] == ["encoder.lstm"]  # Im2Seq only reshapes
    assert all(np.array_equal(v.numpy(), state[k]) for k, v in neck.state_dict().items())


def test_paddleocrs_crnn_from_its_config_scans_through_the_bilstm(ppocr, paddleocr_src):
    import yaml

    architectures, _ = ppocr
    arch = yaml.safe_load((paddleocr_src / "configs/rec/rec_mv3_none_bilstm_ctc.yml").read_text())["Architecture"]
    assert arch["Neck"] == {"name": "SequenceEncoder", "encoder_type": "rnn", "hidden_size": 96}
    arch["Head"]["out_channels"] = 37  # what build_model's caller sets from the character dict (36 + blank)
    paddle.seed(0)
    model = architectures.build_model(copy.deepcopy(arch))
    model.train()
    x = paddle.rand([2, 3, 32, 100])
    report = ampsafe.scan(model, (x,))
    own, ending = _lstm_paths(report, "neck.encoder.lstm")
    assert own.start_op == "rnn_input_matmul" and own.normalized and not own.risky
    assert not any(p.risky for p in ending)
    assert [p.start for p in report.paths if not p.normalized and "<output>" in p.ends] == ["head.fc"]
    with ampsafe.paddle.emulate_fp16(model, level="O1") as emu:  # the kernel goes through the emulator too
        model(x).mean().backward()
    assert "rnn" in emu.report()["fp32"]  # gray, with float32 weights at O1: float32, as Paddle runs it
