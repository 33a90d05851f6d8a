"""``ampsafe.deepspeed.wrap(engine, min_scale=1.0, on_floor="heal")``: ampsafe's floor, cap and heal in a DeepSpeed
engine's loss scale, whichever of DeepSpeed's three implementations its config chose (ZeRO 1-3 ``"fp16"``,
ZeRO-0 ``"fp16"``, ``"torch_autocast"`` float16). ``ampsafe run`` does it for every ``deepspeed.initialize``.
Importing this module imports neither torch nor DeepSpeed; see :mod:`ampsafe.torch.deepspeed`.

    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    scale = ampsafe.deepspeed.wrap(engine, min_scale=1.0, on_floor="heal")
"""

from __future__ import annotations

from .torch.deepspeed import Mode, fix_lines, mode_of, wrap

__all__ = ["wrap", "Mode", "mode_of", "fix_lines"]
