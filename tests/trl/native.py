"""Run a training script natively in float16 on this CPU: torch's own ``GradScaler`` with only ampsafe's CUDA
emulation in place (:mod:`ampsafe.torch.cuda_emulation` and accelerate's ``--emulate-fp16`` switch,
:mod:`ampsafe.hosts.accelerate`), so ``fp16=True`` takes accelerate's GPU float16 path as on a GPU. No ampsafe
scaler, guard, patch or report: the frameworks' own behaviour. With ``--scales FILE``, the scale each
``GradScaler.update`` started from and ended at is written to FILE (JSON; ``{rank}`` in it is the process's rank) at exit, read from torch's scaler.

    python tests/trl/native.py [--scales FILE] SCRIPT.py ARGS...   # also as each rank of torch.distributed.run
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import runpy
import sys
from pathlib import Path


def _record_scales(path: str) -> None:
    import torch

    updates: list[tuple[float, float]] = []
    original = torch.amp.GradScaler.update

    @functools.wraps(original)
    def update(self, new_scale=None):
        before = self.get_scale()
        original(self, new_scale)
        updates.append((before, self.get_scale()))

    torch.amp.GradScaler.update = update
    rank = os.environ.get("RANK", "0")
    atexit.register(lambda: Path(path.format(rank=rank)).write_text(json.dumps(updates), encoding="utf-8"))


def main(argv: list[str]) -> None:
    import accelerate.accelerator

    from ampsafe.hosts import apply
    from ampsafe.torch import cuda_emulation

    if argv[:1] == ["--scales"]:
        _record_scales(argv[1])
        argv = argv[2:]
    cuda_emulation.install()
    line = apply("accelerate", accelerate.accelerator, setattr, lambda said: None)
    assert not line.startswith("warning"), line
    script, *rest = argv
    sys.argv = [script, *rest]
    sys.path.insert(0, str(Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
