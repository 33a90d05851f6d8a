"""An mmengine ``Runner`` that knows nothing about ampsafe: ``AmpOptimWrapper`` and a ``TensorboardVisBackend``,
a one-layer regressor on inputs large enough that its float16 gradients overflow at the starting scale 65536
(skipped steps, backoffs, then clean steps). Under ``ampsafe run --emulate-fp16`` it trains in float16 on a CPU."""

from __future__ import annotations

import argparse
import warnings

import torch
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch.utils.data import Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--work-dir", required=True)
parser.add_argument("--steps", type=int, default=12)
args = parser.parse_args()
warnings.filterwarnings("ignore")
BATCH = 8


class Large(Dataset):
    def __init__(self, n: int) -> None:
        self.x = 10.0 * torch.randn(n, 16, generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return {"inputs": self.x[i]}


class Regressor(BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(16, 1)

    def forward(self, inputs, data_samples=None, mode="tensor"):
        out = self.net(inputs)
        return {"loss": out.float().pow(2).mean()} if mode == "loss" else out


torch.manual_seed(0)
runner = Runner(
    model=Regressor(),
    work_dir=args.work_dir,
    train_dataloader=dict(
        dataset=Large(BATCH * args.steps),
        sampler=dict(type="DefaultSampler", shuffle=False),
        batch_size=BATCH,
        num_workers=0,
        collate_fn=dict(type="default_collate"),
    ),
    optim_wrapper=dict(type="AmpOptimWrapper", optimizer=dict(type="SGD", lr=1e-6)),
    train_cfg=dict(by_epoch=False, max_iters=args.steps),
    default_hooks=dict(
        logger=dict(type="LoggerHook", interval=1), checkpoint=dict(type="CheckpointHook", interval=1000)
    ),
    visualizer=dict(type="Visualizer", vis_backends=[dict(type="TensorboardVisBackend")]),
    log_level="WARNING",
)
runner.train()
print(f"script: trained {runner.iter} iterations", flush=True)
