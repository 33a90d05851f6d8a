"""A Lightning script that knows nothing about ampsafe: ``precision="16-mixed"`` with a ``TensorBoardLogger``,
a log every step, on ``growth.py``'s recipe (tests/trainers/scripts), whose own training drives ``net.head`` past
65504 at step 4. Under ``ampsafe run --emulate-fp16`` it trains in float16 with ampsafe's scaler on a CPU."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "trainers" / "scripts"))
import growth  # noqa: E402
import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.loggers import TensorBoardLogger  # noqa: E402
from lightning_model import Regressor  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=12)
args = parser.parse_args()
warnings.filterwarnings("ignore")

torch.manual_seed(0)
x, y = growth.data(args.steps)
trainer = L.Trainer(
    accelerator="cpu",
    devices=1,
    precision="16-mixed",
    max_steps=args.steps,
    max_epochs=1,
    logger=TensorBoardLogger(args.out, name="tb"),
    log_every_n_steps=1,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
)
trainer.fit(Regressor(False), DataLoader(TensorDataset(x, y), batch_size=growth.BATCH, shuffle=False))
print(f"script: trained {trainer.global_step} steps", flush=True)
