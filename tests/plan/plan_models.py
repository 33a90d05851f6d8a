"""The models the plan tests apply their lines to, built the same way by the fixture scripts and the tests.

``router_net``: a torch decoder of two residual blocks, each routing its tokens to two experts; block 1's router
weight is scaled so its logits reach about 3 x 65504 in float32 (inf in float16: the softmax after it is NaN),
the MoE router overflow that Megatron's ``--moe-router-dtype fp32`` exists for. ``paddle_net``: the same idea
in Paddle (a ``router`` Linear whose output passes 65504), for ``paddle.amp.decorate(level="O2")``.
"""

from __future__ import annotations

ROUTER = "layers.1.router"
PADDLE_ROUTER = "router"
DIM, EXPERTS, TOKENS = 16, 2, 8


def router_net(seed: int = 0):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(DIM)
            self.router = nn.Linear(DIM, EXPERTS)
            self.experts = nn.ModuleList(nn.Linear(DIM, DIM) for _ in range(EXPERTS))

        def forward(self, x):
            h = self.norm(x)
            # as Mixtral's MoE block: a float32 softmax of the logits, the weights back in the tokens' dtype
            weights = torch.softmax(self.router(h), -1, dtype=torch.float32).to(h.dtype)
            mixed = sum(weights[..., i : i + 1] * expert(h) for i, expert in enumerate(self.experts))
            return x + mixed

    class RouterNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(4, DIM)
            self.layers = nn.ModuleList(Block() for _ in range(2))
            self.head = nn.Linear(DIM, 1)

        def forward(self, x):
            h = self.embed(x)
            for layer in self.layers:
                h = layer(h)
            return self.head(h)

    torch.manual_seed(seed)
    model = RouterNet()
    with torch.no_grad():
        model.get_submodule(ROUTER).weight.mul_(2.0e5)
    return model


def export_router(path) -> tuple:
    """``router_net()`` in eval mode exported to ONNX at ``path`` by the TorchScript exporter (the module scopes
    ``ampsafe plan --to modelopt`` names): (the model, its input ``x``)."""
    import warnings

    import torch

    model = router_net().eval()
    x, _ = router_batch(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), dynamo=False, input_names=["x"])
    return model, x


def router_batch(step: int):
    import torch

    g = torch.Generator().manual_seed(step)
    return torch.randn(TOKENS, 4, generator=g), torch.randn(TOKENS, 1, generator=g)


def paddle_net(seed: int = 0):
    import paddle
    from paddle import nn

    class PaddleNet(nn.Layer):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(4, DIM)
            self.norm0 = nn.LayerNorm(DIM)
            self.router = nn.Linear(DIM, DIM)
            self.norm = nn.LayerNorm(DIM)
            self.head = nn.Linear(DIM, 1)

        def forward(self, x):
            return self.head(self.norm(self.router(self.norm0(self.embed(x)))))

    paddle.seed(seed)
    model = PaddleNet()
    model.router.weight.set_value(model.router.weight * 1.0e5)
    return model


def paddle_batch(step: int):
    import numpy as np
    import paddle

    rng = np.random.default_rng(step)
    x = rng.standard_normal((TOKENS, 4)).astype("float32")
    y = rng.standard_normal((TOKENS, 1)).astype("float32")
    return paddle.to_tensor(x), paddle.to_tensor(y)
