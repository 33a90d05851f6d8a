"""A Paddle AMP script shaped like PaddleOCR's ``tools/program.py`` (knows nothing about ampsafe): ``decorate``
at O2, ``auto_cast`` around the model's forward only, the loss outside it, ``scaler.scale`` then
``scaler.minimize``. Its head is DBNet's: a shrink and a threshold map through sigmoids, and the step function
``reciprocal(1 + exp(-k (shrink - thresh)))`` with k = 50. The threshold map starts far above the shrink map
(biases -3 and +3), so ``-k (shrink - thresh)`` is ~45: ``exp`` is ~3e19, past float16's 65504, wherever it runs
in float16 (Paddle's O2; at O1 ``exp`` is on the float16 black list)."""

import argparse

import paddle
from paddle import nn

parser = argparse.ArgumentParser()
parser.add_argument("--level", default="O2")
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--init-scale", type=float, default=8.0)
parser.add_argument(
    "--after-decorate", default="", help="Python run after paddle.amp.decorate, with model and optimizer in scope"
)
args = parser.parse_args()


class StepHead(nn.Layer):
    def __init__(self, k: float = 50.0):
        super().__init__()
        self.k = k
        self.shrink, self.thresh = nn.Linear(32, 1), nn.Linear(32, 1)
        self.shrink.bias.set_value(paddle.full([1], -3.0))
        self.thresh.bias.set_value(paddle.full([1], 3.0))

    def step_function(self, x, y):
        return paddle.reciprocal(1 + paddle.exp(-self.k * (x - y)))

    def forward(self, h):
        shrink, thresh = nn.functional.sigmoid(self.shrink(h)), nn.functional.sigmoid(self.thresh(h))
        return paddle.concat([shrink, thresh, self.step_function(shrink, thresh)], axis=1)


class Model(nn.Layer):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.ReLU())
        self.head = StepHead()

    def forward(self, x):
        return self.head(self.backbone(x))


paddle.seed(0)
model = Model()
optimizer = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
if args.level == "O2":
    model, optimizer = paddle.amp.decorate(models=model, optimizers=optimizer, level="O2")
if args.after_decorate:  # a fix line from a report, applied where its comment says
    exec(args.after_decorate)
scaler = paddle.amp.GradScaler(init_loss_scaling=args.init_scale)


def scale() -> float:  # Paddle's own scaler keeps it in ``_scale`` (None when disabled on a CPU)
    value = scaler.get_loss_scaling() if hasattr(scaler, "get_loss_scaling") else scaler._scale
    return 1.0 if value is None else float(value)


for step in range(args.steps):
    x, target = paddle.randn([8, 16]), paddle.rand([8, 3])
    with paddle.amp.auto_cast(level=args.level):
        preds = model(x)
    loss = nn.functional.l1_loss(preds.astype("float32"), target)  # outside auto_cast, as program.py
    scaled = scaler.scale(loss)
    scaled.backward()
    scaler.minimize(optimizer, scaled)
    optimizer.clear_grad()
    print(f"script: step {step} loss {float(loss):.4f} scale {scale()}", flush=True)
print(f"script: done, scale {scale()}", flush=True)
