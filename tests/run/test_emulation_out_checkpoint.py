"""--emulate-fp16 for torch on two things TRL's trainers do (real torch, no TRL needed): a GEMM written into the
caller's buffer (``torch.mm(..., out=tile)``, TRL's chunked log-prob loss) and ``torch.utils.checkpoint``'s
recompute of a forward run inside an emulated block (``gradient_checkpointing=True``, ``SFTConfig``'s default)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ampsafe.torch import cuda_emulation  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="emulates CUDA AMP where there is no CUDA")


@pytest.fixture
def emulated():
    cuda_emulation.install()
    try:
        yield
    finally:
        cuda_emulation.uninstall()


def test_a_gemm_with_out_fills_the_callers_buffer_with_the_float16_product(emulated):
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(4, 8, generator=gen).half()
    b = torch.randn(8, 3, generator=gen).half()
    buf = torch.full((4, 3), float("nan"), dtype=torch.float16)
    acc = torch.ones(4, 3)
    with torch.autocast("cuda"):
        returned = torch.mm(a, b, out=buf)
        torch.addmm(acc, a.float(), b.float(), out=acc)  # reads acc, then writes it: acc += a @ b
    assert returned is buf
    assert torch.equal(buf, (a.float() @ b.float()).half())  # float32 accumulation, rounded into the buffer
    assert torch.allclose(acc, 1 + a.float() @ b.float(), atol=1e-5)


class _SoftmaxBlock(torch.nn.Module):
    """A Linear, a softmax (float32 under CUDA autocast, float16 under CPU autocast's lists), a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.down(torch.softmax(self.up(x), dim=-1))


def _grads(block, x, checkpointed: bool) -> list:
    block.zero_grad()
    with torch.autocast("cuda"):
        if checkpointed:
            out = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
        else:
            out = block(x)
    out.float().square().sum().backward()
    return [p.grad.clone() for p in block.parameters()]


def test_checkpoint_recompute_casts_as_the_emulated_forward_did(emulated):
    torch.manual_seed(0)
    block, x = _SoftmaxBlock(), torch.randn(5, 8)
    plain = _grads(block, x, checkpointed=False)
    recomputed = _grads(block, x, checkpointed=True)  # raised CheckpointError when the recompute used CPU lists
    assert all(torch.equal(p, r) for p, r in zip(plain, recomputed))


def test_checkpoint_outside_an_emulated_block_is_left_as_torch_runs_it(emulated):
    from torch.utils.checkpoint import _get_autocast_kwargs

    _, cpu_kwargs = _get_autocast_kwargs("cpu")
    assert set(cpu_kwargs) == {"enabled", "dtype", "cache_enabled"} and not cpu_kwargs["enabled"]
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the script's own CPU autocast: not an emulated block
        _, cpu_kwargs = _get_autocast_kwargs("cpu")
    assert set(cpu_kwargs) == {"enabled", "dtype", "cache_enabled"}
