"""One Paddle AMP training step as PaddleOCR's ``tools/program.py`` runs it, shared by the demo and the PP-OCRv4
fine-tune so that both measure the same step."""

from __future__ import annotations

__all__ = ["amp_step"]


def amp_step(w, batch, scaler, opt, emulator=None, forward_only: bool = False):
    """Forward, scaled backward, ``scaler.step`` / ``update`` and ``clear_grad`` on workload ``w``; returns the loss.

    ``forward_only``: float16 emulated around the model's forward only and the loss computed outside it (O2 as
    PaddleOCR's program.py runs it); otherwise the caller holds ``emulator`` around the whole loop."""
    if forward_only:
        with emulator:
            preds = w.model(batch[0])
        loss = w.loss_fn(preds, batch)["loss"]
    else:
        loss = w.loss(batch)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.clear_grad()
    return loss
