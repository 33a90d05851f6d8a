"""A user's FSDP2 pure-float16 script, as torchtitan / verl / lerobot set it up, with torch's own GradScaler:
the regression of issue 33 (three nn.Linear, a target of 1e6, AdamW lr 1.0). Run with torchrun, 2 gloo ranks."""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 14

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)
)
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32))
opt = torch.optim.AdamW(model.parameters(), lr=1.0)
scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
gen = torch.Generator().manual_seed(100 + rank)
for step in range(STEPS):
    x = torch.rand(16, 8, generator=gen)
    opt.zero_grad()
    loss = ((model(x).float() - 1e6) / 1e6).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    if rank == 0:
        print(f"step {step} loss {loss.item():.4g} scale {scaler.get_scale()}", flush=True)
dist.destroy_process_group()
