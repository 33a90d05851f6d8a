"""An ordinary mmengine script (knows nothing about ampsafe): a ``Runner`` training a tiny ``BaseModel`` on
synthetic data, with ``--amp`` for ``optim_wrapper=dict(type="AmpOptimWrapper", ...)``.

The network, data, loss and optimizer are ``growth.py``'s: under ``AmpOptimWrapper`` the training itself drives
``net.head`` past float16's 65504 at step 4. ``--runs``: comma-separated ``fp32`` or ``amp``, optionally
``:NAN_STEP`` (a NaN in the batch of that step), one fresh model and ``Runner`` each. Prints, per run, parameters
finite, ``net.embed``'s output dtype, the optimizer wrapper and its loss scaler.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings

import growth  # beside this script
import torch
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch.utils.data import Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--runs", default="fp32", help="fp32 or amp, each with an optional :NAN_STEP, comma-separated")
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()
warnings.filterwarnings("ignore")


class Pairs(Dataset):
    def __init__(self, nan_step: int) -> None:
        self.x, self.y = growth.data(args.steps, nan_step)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        return {"inputs": self.x[i], "data_samples": self.y[i]}


class Regressor(BaseModel):
    def __init__(self) -> None:
        super().__init__()
        self.net = growth.chain()
        self.dtypes: set = set()
        self.net.embed.register_forward_hook(lambda _m, _i, out: self.dtypes.add(str(out.dtype)[6:]))

    def forward(self, inputs, data_samples=None, mode="tensor"):
        out = self.net(inputs)
        if mode == "loss":
            return {"loss": growth.loss(out, data_samples)}
        return out


def train(kind: str, nan_step: int = -1) -> None:
    torch.manual_seed(0)
    model = Regressor()
    optimizer = dict(type="Adam", lr=growth.LR)
    with tempfile.TemporaryDirectory() as work_dir:
        runner = Runner(
            model=model,
            work_dir=work_dir,
            train_dataloader=dict(
                dataset=Pairs(nan_step),
                sampler=dict(type="DefaultSampler", shuffle=False),
                batch_size=growth.BATCH,
                num_workers=0,
                collate_fn=dict(type="default_collate"),
            ),
            optim_wrapper=dict(type="AmpOptimWrapper", optimizer=optimizer)
            if kind == "amp"
            else dict(optimizer=optimizer),
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
    scaler_name = type(scaler).__module__ + "." + type(scaler).__name__ if scaler is not None else None
    print(
        f"script: done ({kind}), parameters finite: {finite}, embed dtype: {','.join(sorted(model.dtypes))}, "
        f"optim wrapper: {type(wrapper).__name__}, loss scaler: {scaler_name}"
        f", scale: {scaler.get_scale() if scaler is not None else None}",
        flush=True,
    )


for run in args.runs.split(","):
    kind, *nan_step = run.split(":")
    train(kind, *map(int, nan_step))
