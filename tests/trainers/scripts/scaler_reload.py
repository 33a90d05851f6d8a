"""A torch AMP loop that reloads its GradScaler's state mid-run, as a trainer's checkpoint recovery does: the
loss of every third step is inf, and after step 5 the scaler's ``state_dict`` of step 1 is loaded back."""

import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
saved = None
for step in range(9):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = model(torch.randn(8, 4)).float().pow(2).mean()
    if step % 3 == 2:
        loss = loss * float("inf")
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    if step == 1:
        saved = scaler.state_dict()
    if step == 5:
        scaler.load_state_dict(saved)
stats = scaler.stats
print(f"script: done, total_steps {stats.total_steps}, skipped {stats.skipped_steps}, scale {scaler.get_scale()}")
print(f"script: state_dict keys {sorted(scaler.state_dict())}")
