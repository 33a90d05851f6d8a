"""The tiny LightningModule of ``train_lightning.py``, importable by the tests that apply a report's patch line.

Its network, loss and optimizer are the shared recipe of ``growth.py``: in float16 its own training drives
``net.head`` past 65504 at step 4.
"""

from __future__ import annotations

import growth  # beside this module
import lightning as L


class Regressor(L.LightningModule):
    def __init__(self, manual: bool) -> None:
        super().__init__()
        self.automatic_optimization = not manual
        self.net = growth.chain()
        self.dtypes: set = set()
        self.net.embed.register_forward_hook(lambda _m, _i, out: self.dtypes.add(str(out.dtype)[6:]))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, _index):
        x, y = batch
        loss = growth.loss(self(x), y)
        if self.automatic_optimization:
            return loss
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return None

    def configure_optimizers(self):
        return growth.optimizer(self.parameters())
