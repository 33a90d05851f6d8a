"""A PPO-style critic trained under torch's CPU float16 autocast and torch's own GradScaler (knows nothing about
ampsafe): an embedding, two Linear+GELU layers and a ``value_head``, a token-sum MSE against returns near 100
over 512 tokens, AdamW at lr 1e-2. Every forward value stays far below 65504; the value head's bias gradient
sums about 200 per token over 512 tokens, so it overflows float16 at any loss scale of 1 or more: an overflow
only the backward has. Writes one JSON line per step (loss, scale, largest module output) to ``--out``."""

import argparse
import json

import torch
from torch import nn


class Critic(nn.Module):
    def __init__(self, vocab: int = 100, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.fc1, self.fc2 = nn.Linear(width, width), nn.Linear(width, width)
        self.value_head = nn.Linear(width, 1)

    def forward(self, tokens):
        h = nn.functional.gelu(self.fc1(self.embed(tokens)))
        return self.value_head(nn.functional.gelu(self.fc2(h))).squeeze(-1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", required=True)
    parser.add_argument("--after", default="", help="Python run once the model is built (a report's fix line)")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Critic()
    if args.after:
        exec(args.after)
    amax = [0.0]

    def keep(_module, _inputs, output) -> None:
        amax[0] = max(amax[0], float(output.detach().abs().max()))

    for m in model.modules():
        m.register_forward_hook(keep)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024)
    data = torch.Generator().manual_seed(1)
    with open(args.out, "w") as out:
        for step in range(args.steps):
            tokens = torch.randint(0, 100, (1, 512), generator=data)
            returns = 100 + torch.randn(1, 512, generator=data)
            amax[0] = 0.0
            with torch.autocast("cpu", dtype=torch.float16):
                values = model(tokens)
            loss = ((values.float() - returns) ** 2).sum()
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            finite = all(bool(torch.isfinite(p).all()) for p in model.parameters())
            row = {
                "step": step,
                "loss": float(loss.detach()),
                "scale": scaler.get_scale(),
                "amax": amax[0],
                "finite": finite,
            }
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
