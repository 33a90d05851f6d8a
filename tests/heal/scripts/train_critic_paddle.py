"""The critic of ``train_critic.py`` in Paddle (knows nothing about ampsafe): ``paddle.amp.auto_cast`` at O1
around the forward, ``paddle.amp.GradScaler``, a token-sum MSE against returns near 100 over 512 tokens, AdamW
at lr 1e-2. The forward stays far below 65504; the value head's float16 bias gradient sums about 200 per token
over 512 tokens and overflows at any loss scale of 1 or more. Paddle has no float16 on a CPU: run it under
``ampsafe run --emulate-fp16``, or natively after ``ampsafe.paddle.amp_emulation.install()``. Writes one JSON
line per step to ``--out``."""

import argparse
import json

import numpy as np
import paddle
from paddle import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--out", required=True)
parser.add_argument("--after", default="", help="Python run once the model is built (a report's fix line)")
args = parser.parse_args()


class Critic(nn.Layer):
    def __init__(self, vocab: int = 100, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.fc1, self.fc2 = nn.Linear(width, width), nn.Linear(width, width)
        self.value_head = nn.Linear(width, 1)

    def forward(self, tokens):
        h = nn.functional.gelu(self.fc1(self.embed(tokens)))
        return self.value_head(nn.functional.gelu(self.fc2(h))).squeeze(-1)


paddle.seed(0)
model = Critic()
if args.after:
    exec(args.after)
amax = [0.0]


def keep(_layer, _inputs, output) -> None:
    amax[0] = max(amax[0], float(output.detach().abs().max()))


for layer in model.sublayers(include_self=True):
    layer.register_forward_post_hook(keep)
optimizer = paddle.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters())
scaler = paddle.amp.GradScaler(init_loss_scaling=1024)
data = np.random.default_rng(1)
with open(args.out, "w") as out:
    for step in range(args.steps):
        tokens = paddle.to_tensor(data.integers(0, 100, (1, 512)))
        returns = paddle.to_tensor(100 + data.standard_normal((1, 512)).astype("float32"))
        amax[0] = 0.0
        with paddle.amp.auto_cast(level="O1"):
            values = model(tokens)
        loss = ((values.astype("float32") - returns) ** 2).sum()
        scaled = scaler.scale(loss)
        scaled.backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()
        finite = all(bool(paddle.isfinite(p).all()) for p in model.parameters())
        scale = float(scaler.get_loss_scaling()) if hasattr(scaler, "get_loss_scaling") else float(scaler._scale)
        row = {"step": step, "loss": float(loss), "scale": scale, "amax": amax[0], "finite": finite}
        out.write(json.dumps(row) + "\n")
