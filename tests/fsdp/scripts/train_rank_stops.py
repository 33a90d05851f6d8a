"""A user's 2-rank script (gloo) in which rank 0 stops with an error of its own (a check on its loss) while rank 1
is still loading its next batch: torchrun then stops rank 1 with SIGTERM."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
for _ in range(3):
    opt.zero_grad()
    loss = model(torch.ones(2, 4)).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    dist.barrier()
if rank == 0:
    raise RuntimeError("rank 0: the loss check failed")
time.sleep(120)  # rank 1: the next batch's slow loading
