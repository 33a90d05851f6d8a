"""The fidelity case shared by tests/paddle/test_fidelity.py and bench/bench_emulator.py: one small conv net
(conv, add, upsample, concat, conv+BN head) built twice with identical weights, trained step by step in
torch under real float16 autocast and in Paddle under ampsafe's emulator, with the same data, lr and loss
scale. Each step records the loss, where the first non-finite module output appeared (forward) and which
modules' parameter gradients were non-finite (backward)."""

from __future__ import annotations

import math

import numpy as np

CHANNELS = 8


def batches(steps: int, *, seed: int = 0, amp0: float = 40.0, growth: float = 1.5, size: int = 16):
    """Same data for both frameworks: noise whose amplitude grows geometrically, so activations reach the
    float16 edge after a known number of steps."""
    rng = np.random.default_rng(seed)
    target = rng.standard_normal((4, 1, size, size)).astype("float32")
    for step in range(steps):
        x = rng.standard_normal((4, 3, size, size)).astype("float32") * (amp0 * growth**step)
        yield x, target


def torch_net(seed: int = 0):
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, CHANNELS, 3, padding=1)
            self.conv2 = nn.Conv2d(CHANNELS, CHANNELS, 3, stride=2, padding=1)
            self.head_conv = nn.Conv2d(2 * CHANNELS, CHANNELS, 3, padding=1, bias=False)
            self.head_bn = nn.BatchNorm2d(CHANNELS)
            self.out_conv = nn.Conv2d(CHANNELS, 1, 1)

        def forward(self, x):
            c1 = torch.relu(self.conv1(x))
            c2 = torch.relu(self.conv2(c1))
            a = c1 + nn.functional.interpolate(c2, scale_factor=2, mode="nearest")
            cat = torch.cat([a, c1], dim=1)
            return self.out_conv(torch.relu(self.head_bn(self.head_conv(cat))))

    torch.manual_seed(seed)
    net = Net()
    with torch.no_grad():
        net.conv2.weight.mul_(4.0)  # the deeper unnormalized conv reaches the edge first (as DBFPN's do)
    return net


def paddle_net_like(tnet):
    """The same network in Paddle, with the torch net's weights and BN statistics copied in."""
    import paddle
    from paddle import nn

    class Net(nn.Layer):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2D(3, CHANNELS, 3, padding=1)
            self.conv2 = nn.Conv2D(CHANNELS, CHANNELS, 3, stride=2, padding=1)
            self.head_conv = nn.Conv2D(2 * CHANNELS, CHANNELS, 3, padding=1, bias_attr=False)
            self.head_bn = nn.BatchNorm2D(CHANNELS, momentum=0.9, epsilon=1e-5)
            self.out_conv = nn.Conv2D(CHANNELS, 1, 1)

        def forward(self, x):
            c1 = nn.functional.relu(self.conv1(x))
            c2 = nn.functional.relu(self.conv2(c1))
            a = c1 + nn.functional.upsample(c2, scale_factor=2, mode="nearest")
            cat = paddle.concat([a, c1], axis=1)
            return self.out_conv(nn.functional.relu(self.head_bn(self.head_conv(cat))))

    net = Net()
    tstate = {k: v.detach().numpy() for k, v in tnet.state_dict().items()}
    names = {"running_mean": "_mean", "running_var": "_variance"}
    for key, value in net.state_dict().items():
        prefix, _, leaf = key.rpartition(".")
        tleaf = {v: k for k, v in names.items()}.get(leaf, leaf)
        value.set_value(tstate[f"{prefix}.{tleaf}"])
    return net


def _record_torch(net, x, target, scale, lr, device="cpu"):
    import torch

    first = []
    hooks = [
        m.register_forward_hook(
            lambda mod, inp, out, name=name: first.append(name) if not first and not torch.isfinite(out).all() else None
        )
        for name, m in net.named_modules()
        if name
    ]
    try:
        with torch.autocast(device, dtype=torch.float16):
            out = net(torch.from_numpy(x).to(device))
        loss = torch.nn.functional.mse_loss(out.float(), torch.from_numpy(target).to(device))
        net.zero_grad()
        (loss * scale).backward()
    finally:
        for h in hooks:
            h.remove()
    bad = sorted({n.rpartition(".")[0] for n, p in net.named_parameters() if not torch.isfinite(p.grad).all()})
    if not bad and not first:
        with torch.no_grad():
            for p in net.parameters():
                p -= lr * p.grad / scale
    return float(loss.detach()), (first[0] if first else None), bad


def _record_paddle(net, x, target, scale, lr, level):
    import paddle

    from ampsafe.paddle import emulate_fp16

    first = []
    hooks = [
        m.register_forward_post_hook(
            lambda mod, inp, out, name=name: (
                first.append(name) if not first and not bool(paddle.isfinite(out).all()) else None
            )
        )
        for name, m in net.named_sublayers()
    ]
    try:
        with emulate_fp16(net, level=level):
            out = net(paddle.to_tensor(x))
            loss = paddle.nn.functional.mse_loss(out, paddle.to_tensor(target))
            net.clear_gradients()
            (loss * scale).backward()
    finally:
        for h in hooks:
            h.remove()
    bad = sorted(
        {
            n.rpartition(".")[0]
            for n, p in net.named_parameters()
            if p.grad is not None and not bool(paddle.isfinite(p.grad).all())
        }
    )
    if not bad and not first:
        with paddle.no_grad():
            for p in net.parameters():
                if p.grad is not None:
                    p.set_value(p - lr * p.grad / scale)
    return float(loss.detach()), (first[0] if first else None), bad


def run_torch(steps: int, *, scale: float, lr: float, seed: int = 0, device: str = "cpu", **data):
    net = torch_net(seed).to(device).train()
    return _until_overflow(lambda x, t: _record_torch(net, x, t, scale, lr, device), steps, seed, data)


def run_paddle(steps: int, *, scale: float, lr: float, seed: int = 0, level: str = "O1", tnet=None, **data):
    net = paddle_net_like(tnet if tnet is not None else torch_net(seed)).train()
    return _until_overflow(lambda x, t: _record_paddle(net, x, t, scale, lr, level), steps, seed, data)


def _until_overflow(step_fn, steps, seed, data):
    """Per-step records up to and including the first overflowing step."""
    records = []
    for x, target in batches(steps, seed=seed, **data):
        loss, first, bad = step_fn(x, target)
        records.append({"loss": loss, "forward": first, "backward": bad})
        if first or bad or not math.isfinite(loss):
            break
    return records
