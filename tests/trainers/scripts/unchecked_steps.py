"""A notebook's order: the optimizer is built, then ``import ampsafe.auto``, then training. Prints the run
summary ampsafe would print."""

import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

import ampsafe.auto  # noqa: E402

for _ in range(3):
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
print(ampsafe.auto.format_summary([ampsafe.auto.summary()]))
