"""The 2-rank launcher of tests/fsdp: spawned ranks with a deadline, killed when it passes."""

from __future__ import annotations

import time

import pytest


@pytest.fixture
def ranks():
    """``ranks(fn, *args, timeout=s)``: ``fn(rank, 2, *args)`` in 2 spawned processes; fails (after killing both)
    when one raises or they are not done within ``timeout`` seconds: a hang is a failure, not a stuck test."""
    import torch.multiprocessing as mp

    started = []

    def run(fn, *args, timeout: float = 240, nprocs: int = 2) -> None:
        context = mp.start_processes(fn, args=(nprocs, *args), nprocs=nprocs, join=False, start_method="spawn")
        started.append(context)
        deadline = time.monotonic() + timeout
        while not context.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail(f"{fn.__name__} on {nprocs} ranks did not finish in {timeout} s (a hang)")

    yield run
    for context in started:
        for process in context.processes:
            if process.is_alive():
                process.kill()
            process.join(5)
