"""Lightning with ``AmpMetricsCallback``: the ``amp/*`` series its ``TensorBoardLogger`` wrote (read back from the
event file) equal the precision plugin's scaler's own figures after every step.

A ``16-mixed`` precision plugin with an ampsafe scaler on the CPU (CPU float16 autocast), starting at a scale
that overflows float16 (2**40): the first steps are skipped and backed off. The expected figures come from the
scaler's own decisions (its step callback), not from the integration."""

from __future__ import annotations

import warnings

import pytest
from amp_logs import scalars

pytest.importorskip("tensorboard")
L = pytest.importorskip("lightning.pytorch")
torch = pytest.importorskip("torch")

STEPS = 8


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.net(x).float().pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def test_lightning_logger_gets_the_scaler_s_figures_at_every_step(tmp_path):
    import ampsafe.torch
    from ampsafe.integrations.lightning import AmpMetricsCallback

    torch.manual_seed(0)
    decisions = []
    scaler = ampsafe.torch.GradScaler(
        "cpu", init_scale=2.0**40, max_scale=2.0**40, backoff_factor=2.0**-8, callback=decisions.append
    )
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8 * STEPS, 16)), batch_size=8)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=STEPS,
        plugins=[L.plugins.precision.MixedPrecision("16-mixed", "cpu", scaler)],
        logger=L.loggers.TensorBoardLogger(tmp_path, name="tb"),
        log_every_n_steps=1,
        callbacks=[AmpMetricsCallback()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Tiny(), data)

    assert len(decisions) == STEPS and decisions[0].skipped and not decisions[-1].skipped
    series = {tag: [value for _, value in values] for tag, values in scalars(tmp_path / "tb").items()}
    done = [decisions[: n + 1] for n in range(STEPS)]
    assert series["amp/loss_scale"] == [float(d[-1].next_scale) for d in done]
    assert series["amp/skipped_steps"] == [float(sum(x.skipped for x in d)) for d in done]
    assert series["amp/overflow_steps"] == [float(sum(x.found_inf for x in d)) for d in done]
    stats = scaler.stats
    assert {tag: values[-1] for tag, values in series.items() if tag.startswith("amp/")} == {
        "amp/loss_scale": scaler.get_scale(),
        "amp/skipped_steps": stats.skipped_steps,
        "amp/overflow_steps": stats.overflow_steps,
        "amp/floor_hits": stats.floor_hits,
        "amp/heals": len(stats.heals),
    }
