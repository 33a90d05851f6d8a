"""Healthy CUDA AMP training as a user's script does it, for ``ampsafe run --emulate-fp16``: torchvision's resnet18
(SGD lr 0.1, momentum 0.9, 10 classes, 32x32 images) or a tiny HF BERT from random init (AdamW lr 1e-4, 2 labels).
A fixed set of 64 random samples, seeded. ``sys.argv[1]``: resnet18 | bert, ``sys.argv[2]``: the steps."""

import sys

import torch

name = sys.argv[1] if len(sys.argv) > 1 else "resnet18"
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
torch.manual_seed(0)
torch.set_num_threads(1)
if name == "resnet18":
    import torchvision

    model = torchvision.models.resnet18(num_classes=10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = [(torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))) for _ in range(8)]

    def loss_of(batch):
        return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])

else:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        max_position_embeddings=64, num_labels=2,
    )  # fmt: skip
    model = BertForSequenceClassification(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = [(torch.randint(0, 512, (8, 32)), torch.randint(0, 2, (8,))) for _ in range(8)]

    def loss_of(batch):
        return model(input_ids=batch[0], labels=batch[1]).loss


model.train()
scaler = torch.amp.GradScaler("cuda")
for step in range(steps):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = loss_of(data[step % len(data)])
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
print(f"script: {name} {steps} steps, last loss {loss.item():.4f}", flush=True)
