"""--emulate-fp16 for Paddle: a script's auto_cast / decorate / GradScaler behave on a CPU as float16 AMP on a
GPU (real Paddle). The loop is PaddleOCR ``tools/program.py``'s: auto_cast around the model forward only, the
loss outside it, ``scaler.scale(loss)``, ``backward``, ``scaler.minimize(optimizer, scaled)``."""

from __future__ import annotations

import gc
import sys

import pytest

paddle = pytest.importorskip("paddle")

from paddle import nn  # noqa: E402

from ampsafe.paddle import amp_emulation  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # BatchNorm's "always track global mean"


class Net(nn.Layer):
    """conv (white) -> BN -> relu -> head conv -> exp (black at O1, gray at O2)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2D(1, 2, 1, bias_attr=False)
        self.bn = nn.BatchNorm2D(2)
        self.head = nn.Conv2D(2, 1, 1, bias_attr=False)

    def forward(self, x):
        self.features = self.conv(x)  # kept for the tests (relu maps a NaN from BN to 0 on the CPU)
        return paddle.exp(self.head(nn.functional.relu(self.bn(self.features))))


def _net() -> Net:
    paddle.seed(0)
    net = Net()
    net.head.weight.set_value(paddle.full([1, 2, 1, 1], 0.1))
    return net


@pytest.fixture
def emulated():
    lines = amp_emulation.install()
    try:
        yield lines
    finally:
        amp_emulation.uninstall()


def _scale(scaler) -> float:
    return float(scaler.state_dict()["scale"][0])


def _program_step(model, optimizer, scaler, x, **amp):
    """PaddleOCR's train step: returns (preds, the emulator that ran the block)."""
    with paddle.amp.auto_cast(**amp):
        preds = model(x)
        emulator = amp_emulation.current()
    loss = preds.astype("float32").mean()
    scaled = scaler.scale(loss)
    scaled.backward()
    scaler.minimize(optimizer, scaled)
    optimizer.clear_grad()
    return preds, emulator


def _originals():
    import paddle.amp.grad_scaler as grad_scaler

    module = sys.modules["paddle.amp.auto_cast"]
    return (
        module.amp_guard,
        module.amp_decorate,
        paddle.amp.amp_guard,
        paddle.amp.amp_decorate,
        paddle.amp.auto_cast,
        paddle.amp.decorate,
        paddle.amp.GradScaler,
        vars(grad_scaler.AmpScaler)["__init__"],
    )


def test_install_says_what_it_emulates_and_is_active(emulated):
    assert amp_emulation.active()
    assert any("paddle.amp.auto_cast" in line and "emulate_fp16" in line for line in emulated)
    assert any("paddle.amp.GradScaler -> enabled" in line for line in emulated)
    assert amp_emulation.install() == []


def test_O1_program_loop_is_emulated_and_paddles_scaler_scales(emulated, capsys):
    model = _net()
    optimizer = paddle.optimizer.Adam(parameters=model.parameters())
    scaler = paddle.amp.GradScaler(init_loss_scaling=1024)
    assert scaler.is_enable() and _scale(scaler) == 1024.0
    x = paddle.rand([2, 1, 4, 4]) + 0.5

    preds, emulator = _program_step(model, optimizer, scaler, x, level="O1")
    assert emulator is not None and emulator.level == "O1"
    assert {"conv2d", "batch_norm", "relu"} <= emulator.emulated
    assert "exp" in emulator.fp32_ops and "exp" not in emulator.emulated  # black at O1
    assert bool(paddle.isfinite(preds).all()) and _scale(scaler) == 1024.0
    assert amp_emulation.summary()["model_source"] == "optimizer"  # the owner of the optimizer's parameters
    assert amp_emulation.current() is None  # outside the block: float32

    model.conv.weight.set_value(paddle.full([2, 1, 1, 1], 1.0e5))  # conv output 1e5 > 65504: inf in float16
    before = model.head.weight.numpy().copy()
    _program_step(model, optimizer, scaler, x, level="O1")
    assert bool(paddle.isinf(model.features).any())
    assert _scale(scaler) == 512.0  # the overflowing step backed off ...
    assert (model.head.weight.numpy() == before).all()  # ... and was skipped
    assert "Found inf or nan" in capsys.readouterr().out  # Paddle's own scaler said so


def test_every_auto_cast_spelling_is_emulated(emulated):
    conv = _net().conv
    conv.weight.set_value(paddle.full([2, 1, 1, 1], 1.0e5))
    x = paddle.ones([1, 1, 2, 2])
    assert bool(paddle.isfinite(conv(x)).all())
    blocks = (paddle.amp.auto_cast(), paddle.amp.amp_guard(), paddle.amp.autocast("gpu"), paddle.autocast("gpu"))
    for block in blocks:
        with block:
            assert bool(paddle.isinf(conv(x)).all()), block
    assert amp_emulation.summary()["emulated_blocks"] == len(blocks)


def test_custom_black_list_op_is_not_emulated(emulated):
    model = _net()
    model.conv.weight.set_value(paddle.full([2, 1, 1, 1], 1.0e5))
    x = paddle.full([2, 1, 4, 4], 1.0)
    with paddle.amp.auto_cast(level="O1", custom_black_list=["conv2d"]):
        out = model.conv(x)
        emulator = amp_emulation.current()
    assert bool(paddle.isfinite(out).all())
    assert "conv2d" in emulator.fp32_ops and "conv2d" not in emulator.emulated
    with paddle.amp.auto_cast(level="O1"):
        assert bool(paddle.isinf(model.conv(x)).all())


def test_O2_decorate_returns_the_script_objects_and_blocks_emulate_O2(emulated):
    model = _net()
    optimizer = paddle.optimizer.Adam(parameters=model.parameters())
    scaler = paddle.amp.GradScaler(init_loss_scaling=1024)
    decorated, decorated_opt = paddle.amp.decorate(
        models=model, optimizers=optimizer, level="O2", master_weight=True, excluded_layers=[model.head]
    )
    assert decorated is model and decorated_opt is optimizer
    assert model.conv.weight.dtype == paddle.float32  # float32 master weights, float16 at use

    x = paddle.rand([2, 1, 4, 4]) + 0.5
    preds, emulator = _program_step(model, optimizer, scaler, x, level="O2")
    assert emulator.level == "O2" and amp_emulation.summary()["model_source"] == "decorate"
    assert emulator.is_fp16(model.conv.weight)  # decorate O2 casts it ...
    assert not any(emulator.is_fp16(p) for p in model.bn.parameters())  # ... not the norm layer's
    assert not emulator.is_fp16(model.head.weight)  # ... nor excluded_layers'
    assert bool(paddle.isfinite(preds).all()) and _scale(scaler) == 1024.0

    model.head.weight.set_value(paddle.full([1, 2, 1, 1], 10.0))  # exp(> 11.1) > 65504
    with paddle.amp.auto_cast(level="O2"):
        o2 = model(x)
        emulator = amp_emulation.current()
    assert "exp" in emulator.emulated and bool(paddle.isinf(o2).any())  # gray at O2: float16
    with pytest.warns(RuntimeWarning, match=r"level='O1'\) after paddle.amp.decorate\(level='O2'\)"):
        with paddle.amp.auto_cast(level="O1"):
            assert bool(paddle.isfinite(model(x)).all())  # black at O1


def test_disabled_and_bfloat16_blocks_run_in_float32(emulated):
    model = _net()
    model.conv.weight.set_value(paddle.full([2, 1, 1, 1], 1.0e5))
    x = paddle.full([2, 1, 4, 4], 1.0)
    with paddle.amp.auto_cast():
        with paddle.amp.auto_cast(enable=False):  # a float32 sub-region, as on a GPU
            assert amp_emulation.current() is None
            assert bool(paddle.isfinite(model.conv(x)).all())
        assert bool(paddle.isinf(model.conv(x)).all())
    with pytest.warns(RuntimeWarning, match="bfloat16.*not emulated"):
        with paddle.amp.auto_cast(dtype="bfloat16"):
            assert amp_emulation.current() is None
            assert bool(paddle.isfinite(model.conv(x)).all())
    assert amp_emulation.summary()["not_emulated"] == {"disabled": 1, "bfloat16": 1}


def test_uninstall_restores_the_original_attributes_and_paddles_cpu_behaviour():
    originals = _originals()
    model = _net()
    amp_emulation.install()
    assert _originals()[0] is not originals[0]
    paddle.amp.decorate(models=model, level="O2", excluded_layers=[model.head])
    assert model.head._cast_to_low_precision is False
    amp_emulation.uninstall()
    amp_emulation.uninstall()  # idempotent
    assert all(now is before for now, before in zip(_originals(), originals))
    assert model.head._cast_to_low_precision is True
    assert not amp_emulation.active()
    assert not paddle.amp.GradScaler().is_enable()  # disables itself on a CPU again
    model.conv.weight.set_value(paddle.full([2, 1, 1, 1], 1.0e5))
    with paddle.amp.auto_cast():
        assert bool(paddle.isfinite(model.conv(paddle.ones([1, 1, 2, 2]))).all())


def test_O2_block_without_decorate_uses_the_optimizers_model_and_says_so(emulated):
    gc.collect()  # earlier tests' optimizers: the block resolves the model from the live ones
    model = _net()
    optimizer = paddle.optimizer.SGD(parameters=model.head.parameters())  # an optimizer over the head alone
    with pytest.warns(RuntimeWarning, match=r"without paddle.amp.decorate\(level='O2'\)"):
        with paddle.amp.auto_cast(level="O2"):
            emulator = amp_emulation.current()
    assert emulator.level == "O2" and emulator.model is model.head  # Backend.owner_of: the smallest owner
    assert emulator.is_fp16(model.head.weight) and not emulator.is_fp16(model.conv.weight)
    assert amp_emulation.summary()["model_source"] == "optimizer"
    del optimizer


def test_ppdet_trainer_with_amp_runs_as_with_use_gpu_while_installed():
    """ppdet's Trainer passes ``enable=cfg.use_gpu`` (false on a CPU): under the emulation its AMP methods read
    ``use_gpu`` as true for the call and restore it; without ``amp`` nothing changes; uninstall restores them.
    The whole Trainer run is tests/run/test_upstream_trainers.py's."""
    trainer_module = pytest.importorskip("ppdet.engine.trainer")
    from ppdet.core.workspace import AttrDict

    ssod = pytest.importorskip("ppdet.engine.trainer_ssod")
    Trainer = trainer_module.Trainer
    originals = {name: Trainer.__dict__[name] for name in amp_emulation.PPDET_AMP_METHODS}
    # the semi-supervised trainers run their own training and evaluation loops, with the same enable=cfg.use_gpu
    Teacher = ssod.Trainer_DenseTeacher
    own = {name: Teacher.__dict__[name] for name in amp_emulation.PPDET_AMP_METHODS if name in Teacher.__dict__}
    assert "train" in own
    seen = []
    probe = amp_emulation._ppdet_as_gpu(lambda self: seen.append(self.cfg.use_gpu))  # what train() reads
    trainer = object.__new__(Trainer)  # no __init__: it builds data loaders; the wrapper reads cfg and use_amp
    trainer.cfg = AttrDict(use_gpu=False)
    trainer.use_amp = True
    probe(trainer)  # not installed: untouched
    lines = amp_emulation.install()
    try:
        assert any("ppdet.engine.Trainer with amp" in line for line in lines)
        assert any("Trainer_DenseTeacher" in line for line in lines)
        assert amp_emulation.install_ppdet() == []  # once per class
        assert all(Trainer.__dict__[n] is not f for n, f in originals.items())
        assert all(Teacher.__dict__[n] is not f for n, f in own.items())
        probe(trainer)
        assert trainer.cfg.use_gpu is False  # restored after the call
        trainer.use_amp = False
        probe(trainer)  # a Trainer without amp keeps its config
        assert amp_emulation.summary()["ppdet_as_gpu"] == 1
    finally:
        amp_emulation.uninstall()
    assert seen == [False, True, False]
    assert all(Trainer.__dict__[n] is f for n, f in originals.items())
    assert all(Teacher.__dict__[n] is f for n, f in own.items())
