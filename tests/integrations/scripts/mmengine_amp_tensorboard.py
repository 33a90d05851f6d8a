"""An mmengine ``Runner`` whose config names ``custom_hooks=[dict(type="AmpSafeHook")]`` (with ``custom_imports``),
``AmpOptimWrapper`` and a ``TensorboardVisBackend`` (the config file holds the two ampsafe lines a user adds): a one-layer regressor on inputs large enough that its
float16 gradients overflow at the starting scale 65536 (skipped steps, backoffs, then clean steps).

Run under ``ampsafe run --emulate-fp16``, so ``AmpOptimWrapper`` trains in float16 on a CPU with its own scaler
(ampsafe's). Prints one JSON line: the scaler's own figures after training.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import torch
from mmengine.config import Config
from mmengine.model import BaseModel
from mmengine.runner import Runner
from scaler_figures import scaler_figures
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


# the two lines a user's config file gains; Config.fromfile runs its custom_imports
config_file = Path(args.work_dir) / "amp_config.py"
config_file.parent.mkdir(parents=True, exist_ok=True)
config_file.write_text(
    'custom_imports = dict(imports=["ampsafe.integrations.mmengine"], allow_failed_imports=False)\n'
    'custom_hooks = [dict(type="AmpSafeHook")]\n'
)
config = Config.fromfile(str(config_file))

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
    custom_hooks=config.custom_hooks,
    visualizer=dict(type="Visualizer", vis_backends=[dict(type="TensorboardVisBackend")]),
    log_level="WARNING",
)
runner.train()
scaler = runner.optim_wrapper.loss_scaler
figures = {**scaler_figures(scaler), "scale_history": list(scaler.stats.scale_history)}
print("FIGURES " + json.dumps(figures), flush=True)
