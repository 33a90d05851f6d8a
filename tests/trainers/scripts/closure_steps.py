"""Optimizer steps in every calling form (``step()``, ``step(None)``, ``step(closure)``, ``step(closure=...)``,
LBFGS), each form on its own model, with a NaN batch at ``--nan-step``.

Prints one line per form: parameters finite, how many times the closure ran, what each step returned.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
FORMS = ["plain", "none", "closure", "closure-kw", "lbfgs"]
parser.add_argument("--forms", default=",".join(FORMS))
parser.add_argument("--nan-step", type=int, default=2)
parser.add_argument("--steps", type=int, default=5)
args = parser.parse_args()


def run(form: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    if form == "lbfgs":
        optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = 0
    returned = []
    for step in range(args.steps):
        x, y = torch.randn(16, 4), torch.randn(16, 1)
        if step == args.nan_step:
            x[3, 1] = float("nan")

        def closure(x=x, y=y):
            nonlocal calls
            calls += 1
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        if form == "plain":
            closure()
            out = optimizer.step()
        elif form == "none":
            closure()
            out = optimizer.step(None)  # accelerate's AcceleratedOptimizer.step passes its closure positionally
        elif form == "closure-kw":
            out = optimizer.step(closure=closure)
        else:
            out = optimizer.step(closure)
        returned.append(None if out is None else round(float(out), 3))
    finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
    print(f"script: form={form} parameters finite: {finite} closure calls: {calls} returned: {returned}")


for form in args.forms.split(","):
    run(form)
