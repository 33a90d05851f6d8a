"""A plain CUDA AMP loop on the t5 brink (what a user's script does), for ``ampsafe run --emulate-fp16``.

``torch.amp.GradScaler("cuda")`` and ``torch.autocast("cuda")`` as written for a GPU; the brink's ``wo`` is past
65504 from the first step, so every forward overflows until the scaler heals it. ``sys.argv[1]``: the seed.
"""

import sys

import torch

from ampsafe_lab.workloads import t5_brink

torch.set_num_threads(1)
workload, optimizer, first = t5_brink.brink_start(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
scaler = torch.amp.GradScaler("cuda", init_scale=1024.0)
for step in range(10):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = workload.loss(workload.batch(first + step))
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    print(f"step {step}: loss {loss.item():.4f} scale {scaler.get_scale():g}", flush=True)
