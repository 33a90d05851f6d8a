"""An ordinary torchvision Faster R-CNN training loop (knows nothing about ampsafe); one target has a bad box."""

import argparse

import torch
import torchvision

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=2)
parser.add_argument("--bad-step", type=int, default=1)
parser.add_argument("--bad-sample", type=int, default=1)
args = parser.parse_args()

torch.manual_seed(0)
model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
    weights=None, weights_backbone=None, num_classes=3, min_size=64, max_size=64
)
model.train()
optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-3)

for step in range(args.steps):
    images = [torch.rand(3, 64, 64) for _ in range(2)]
    targets = [
        {"boxes": torch.tensor([[4.0, 4.0, 30.0, 40.0], [20.0, 10.0, 60.0, 50.0]]), "labels": torch.tensor([1, 2])}
        for _ in range(2)
    ]
    if step == args.bad_step:
        targets[args.bad_sample]["boxes"][1] = torch.tensor([20.0, 10.0, 20.0, 50.0])  # zero width
    losses = model(images, targets)
    loss = sum(losses.values())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"script: step {step} loss {float(loss):.4f} boxes {[len(t['boxes']) for t in targets]}", flush=True)
print("script: done", flush=True)
