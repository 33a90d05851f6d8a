"""An ordinary mmengine script (knows nothing about ampsafe): a ``Runner`` training a tiny ``BaseModel`` on
synthetic data, with ``--amp`` for ``optim_wrapper=dict(type="AmpOptimWrapper", ...)``.

``--nan-step K`` puts a NaN in the batch of step K; ``--overflow`` scales the first Linear's weight so that its
output passes float16's 65504. Prints parameters finite, the first Linear's output dtype, the optimizer wrapper
and its loss scaler.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings

import torch
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch import nn
from torch.utils.data import Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--amp", action="store_true")
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--nan-step", type=int, default=-1)
parser.add_argument("--overflow", action="store_true")
args = parser.parse_args()
warnings.filterwarnings("ignore")


class Pairs(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 16, generator=g), torch.randn(n, 1, generator=g)
        if args.nan_step >= 0:
            self.x[8 * args.nan_step + 3, 2] = float("nan")

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return {"inputs": self.x[i], "data_samples": self.y[i]}


class Regressor(BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential()
        self.net.add_module("embed", nn.Linear(16, 64))
        self.net.add_module("norm", nn.LayerNorm(64))
        self.net.add_module("head", nn.Linear(64, 1))
        self.dtypes: set = set()
        self.net.embed.register_forward_hook(lambda _m, _i, out: self.dtypes.add(str(out.dtype)[6:]))

    def forward(self, inputs, data_samples=None, mode="tensor"):
        out = self.net(inputs)
        if mode == "loss":
            return {"loss": nn.functional.mse_loss(out.float(), data_samples)}
        return out


torch.manual_seed(0)
model = Regressor()
if args.overflow:
    with torch.no_grad():
        model.net.embed.weight.mul_(3e5)  # |output| ~ 1e5: inf in float16
optimizer = dict(type="SGD", lr=1e-3)
with tempfile.TemporaryDirectory() as work_dir:
    runner = Runner(
        model=model,
        work_dir=work_dir,
        train_dataloader=dict(
            dataset=Pairs(8 * args.steps),
            sampler=dict(type="DefaultSampler", shuffle=False),
            batch_size=8,
            num_workers=0,
            collate_fn=dict(type="default_collate"),
        ),
        optim_wrapper=dict(type="AmpOptimWrapper", optimizer=optimizer) if args.amp else dict(optimizer=optimizer),
        train_cfg=dict(by_epoch=False, max_iters=args.steps),
        default_hooks=dict(
            logger=dict(type="LoggerHook", interval=100), checkpoint=dict(type="CheckpointHook", interval=1000)
        ),
        log_level="WARNING",
    )
    runner.train()
finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
wrapper = runner.optim_wrapper
scaler = getattr(wrapper, "loss_scaler", None)
print(
    f"script: done, parameters finite: {finite}, embed dtype: {','.join(sorted(model.dtypes))}, optim wrapper: "
    f"{type(wrapper).__name__}, loss scaler: {type(scaler).__module__ + '.' + type(scaler).__name__ if scaler else None}"
    f", scale: {scaler.get_scale() if scaler is not None else None}",
    flush=True,
)
