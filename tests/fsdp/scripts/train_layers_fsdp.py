"""A user's FSDP2 pure-float16 script sharded per layer, as torchtitan and verl lay it out: each layer
``fully_shard``-ed, then the model, all with ``MixedPrecisionPolicy(param_dtype=torch.float16)`` and torch's own
GradScaler. Three nn.Linear (``first``, ``mid``, ``last``) trained towards a target of 1e6 (AdamW lr 1.0): the
stream between the units grows past 65504 by training. Run with torchrun, 2 gloo ranks."""

import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 14


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(8, 32)
        self.mid = torch.nn.Linear(32, 32)
        self.last = torch.nn.Linear(32, 1)

    def forward(self, x):
        return self.last(torch.relu(self.mid(torch.relu(self.first(x)))))


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = Net()
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
policy = MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float32)
fully_shard(model.first, mesh=mesh, mp_policy=policy)
fully_shard(model.mid, mesh=mesh, mp_policy=policy)
fully_shard(model.last, mesh=mesh, mp_policy=policy)
fully_shard(model, mesh=mesh, mp_policy=policy)
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
