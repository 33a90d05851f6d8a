"""--emulate-fp16 for torch: a script's CUDA autocast and GradScaler run as CPU float16 AMP (real torch)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")

from ampsafe.torch import cuda_emulation  # noqa: E402

pytestmark = [
    pytest.mark.skipif(torch.cuda.is_available(), reason="emulates CUDA AMP where there is no CUDA"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),  # torch.cuda.amp.* are deprecated spellings
]


def _originals():
    from torch.amp import autocast_mode, grad_scaler

    return (
        vars(autocast_mode.autocast)["__init__"],
        vars(autocast_mode.autocast)["__enter__"],
        vars(autocast_mode.autocast)["__exit__"],
        vars(grad_scaler.GradScaler)["__init__"],
        torch.autocast,
        torch.amp.autocast,
        torch.cuda.amp.autocast,
        torch.amp.GradScaler,
        torch.cuda.amp.GradScaler,
    )


@pytest.fixture
def emulated():
    lines = cuda_emulation.install()
    try:
        yield lines
    finally:
        cuda_emulation.uninstall()


def _script_step(model, optimizer, scaler, x):
    """One step of the usual script: forward under torch.cuda.amp.autocast, the loss outside, scaled backward.
    The loss's gradient grows with the output, so an inf output gives inf gradients (a plain sum would not)."""
    with torch.cuda.amp.autocast():
        out = model(x)
    loss = out.float().square().mean()
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    return out


def test_install_says_what_it_emulates_and_is_active(emulated):
    assert cuda_emulation.active()
    assert any("torch.cuda.amp.autocast -> CPU autocast in float16" in line for line in emulated)
    assert any("GradScaler('cpu')" in line for line in emulated)
    assert cuda_emulation.install() == []  # a second call changes nothing


def test_every_cuda_autocast_spelling_runs_a_linear_in_float16_on_the_cpu(emulated):
    linear = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    for block in (torch.cuda.amp.autocast(), torch.autocast("cuda"), torch.amp.autocast(device_type="cuda")):
        with block:
            assert linear(x).dtype == torch.float16
    with torch.autocast("cuda", dtype=torch.bfloat16):
        assert linear(x).dtype == torch.bfloat16  # the script's own dtype
    with torch.cuda.amp.autocast(enabled=False):
        assert linear(x).dtype == torch.float32
    with torch.autocast("cuda"):
        with torch.autocast("cuda", enabled=False):  # a float32 sub-region, as on a GPU
            assert linear(x).dtype == torch.float32
        assert linear(x).dtype == torch.float16
    assert linear(x).dtype == torch.float32 and x.device.type == "cpu"


def test_emulated_blocks_follow_cuda_autocasts_lists_not_the_cpus(emulated):
    linear = torch.nn.Linear(4, 64)
    with torch.no_grad():
        linear.weight.fill_(500.0)
        linear.bias.zero_()
    x = torch.ones(2, 4)
    with torch.cuda.amp.autocast():
        h = linear(x)  # float16, 2000 each
        assert h.dtype == torch.float16
        total = h.sum()  # CUDA sums in float32: 256000, where a float16 sum (CPU autocast's) is inf
        assert total.dtype == torch.float32 and float(total.detach()) == 256000.0
        assert torch.exp(h / 1000).dtype == torch.float32
        assert torch.nn.functional.softmax(h, dim=-1).dtype == torch.float32
        assert torch.mv(torch.ones(3, 4), torch.ones(4)).dtype == torch.float16  # CUDA lowers mv; the CPU does not
        assert (h + 1).dtype == torch.float16  # everything else as CPU autocast does it
        with torch.cuda.amp.autocast(enabled=False):
            assert h.sum().dtype == torch.float16  # no autocast, no casts
    assert h.sum().dtype == torch.float16 and bool(torch.isinf(h.sum()))  # outside: the mode is gone
    with torch.autocast("cpu", dtype=torch.float16):
        assert linear(x).sum().dtype == torch.float16  # the script's own CPU autocast is left alone


def test_cuda_grad_scaler_scales_and_skips_the_step_whose_float16_forward_overflows(emulated):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.cuda.amp.GradScaler(init_scale=1024.0)
    assert scaler.is_enabled() and scaler.get_scale() == 1024.0
    x = torch.ones(2, 4)

    before = model.weight.detach().clone()
    out = _script_step(model, optimizer, scaler, x)
    assert out.dtype == torch.float16 and bool(torch.isfinite(out).all())
    assert not torch.equal(model.weight, before)  # a clean step was taken
    assert scaler.get_scale() == 1024.0

    with torch.no_grad():
        model.weight.fill_(3.0e4)  # 4 inputs of 1 x 3e4 = 1.2e5 > 65504: inf in float16, finite in float32
    assert bool(torch.isfinite(model(x)).all())
    for expected_scale in (512.0, 256.0):
        before = model.weight.detach().clone()
        out = _script_step(model, optimizer, scaler, x)
        assert bool(torch.isinf(out).any())
        assert torch.equal(model.weight, before)  # skipped
        assert scaler.get_scale() == expected_scale

    other = torch.amp.GradScaler("cuda")
    assert other.is_enabled() and other.get_scale() == 2.0**16


def test_map_device_maps_cuda_to_cpu_only_while_installed():
    assert cuda_emulation.map_device("cuda") == "cuda"
    cuda_emulation.install()
    try:
        assert cuda_emulation.map_device("cuda") == "cpu"
        assert cuda_emulation.map_device("cuda:1") == "cpu"
        assert cuda_emulation.map_device(torch.device("cuda", 0)) == "cpu"
        assert cuda_emulation.map_device("cpu") == "cpu"
    finally:
        cuda_emulation.uninstall()
    assert cuda_emulation.map_device("cuda") == "cuda"


def test_uninstall_restores_the_original_attributes_and_torchs_cpu_behaviour():
    originals = _originals()
    cuda_emulation.install()
    assert all(now is not before for now, before in zip(_originals()[:4], originals[:4]))
    cuda_emulation.uninstall()
    cuda_emulation.uninstall()  # idempotent
    assert all(now is before for now, before in zip(_originals(), originals))
    assert not cuda_emulation.active()
    linear = torch.nn.Linear(4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autocast("cuda"):
            assert linear(torch.randn(2, 4)).dtype == torch.float32  # disabled again, as torch does without CUDA
        assert not torch.cuda.amp.GradScaler().is_enabled()
