"""DeepSpeed on a CPU for these tests: what a test machine lacks, supplied here and nowhere in ampsafe.

- DeepSpeed's float16 gate (``CPU_Accelerator.is_fp16_supported``: oneDNN float16, AVX512-FP16 / AMX-FP16 CPUs
  only) refuses ``"fp16"`` configs on the AVX2 / AVX-512F CPUs these tests run on (``ValueError: Type fp16 is not
  supported on your device.``), although torch computes float16 on any CPU; the tests open it.
- Each CPU process would JIT-build the ``deepspeed_shm_comm`` C++ op (g++, about 80 s): marked incompatible, so
  DeepSpeed's collectives go through torch.distributed (gloo) alone.
"""

from __future__ import annotations

import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def open_cpu_float16() -> None:
    """The gate opened and the shm op skipped (before ``deepspeed.init_distributed``)."""
    import deepspeed.ops
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    CPU_Accelerator.is_fp16_supported = lambda self: True
    # set before DeepSpeed's first read, which would probe every op with compiler runs
    vars(deepspeed.ops).setdefault("__compatible_ops__", {})["deepspeed_shm_comm"] = False
