"""The t5 brink's warm state (``wo`` about half of 65504) trained under CUDA AMP as a user's script does, for
``ampsafe run --emulate-fp16``: under AMP ``wo`` crosses 65504 by itself a few steps later. ``sys.argv[1]``: the
seed, ``sys.argv[2]``: the steps. The report holds the samples and the warning."""

import sys

import torch

from ampsafe_lab.workloads import t5_brink

torch.set_num_threads(1)
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10
workload, optimizer, first = t5_brink.brink_start(seed, warm=True)
scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)
for step in range(steps):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = workload.loss(workload.batch(first + step))
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
