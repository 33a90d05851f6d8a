"""--emulate-fp16 for Lightning (``Trainer(precision="16-mixed")`` and Fabric) on a CPU.

Lightning's accelerator connector rewrites ``16-mixed`` on a CPU to ``bf16-mixed`` (with a warning) and builds
``MixedPrecision(precision, "cpu")``. For a ``16-mixed`` run on a CPU accelerator, this lets the connector
choose as it would on a GPU: ``MixedPrecision("16-mixed", "cuda")``, whose autocast is ``torch.autocast("cuda",
float16)`` (the emulation: CPU float16 with CUDA's op lists) and whose scaler is ``torch.amp.GradScaler("cuda")``
(ampsafe's, scaling on the CPU). The accelerator, and so every tensor, stays on the CPU: only the precision
plugin's device string is "cuda". Strategies with their own precision (DeepSpeed, FSDP, XLA) are untouched.
"""

from __future__ import annotations

import functools

TARGETS = (
    "lightning.pytorch.trainer.connectors.accelerator_connector",
    "pytorch_lightning.trainer.connectors.accelerator_connector",
    "lightning.fabric.connector",
    "lightning_fabric.connector",
)
_METHOD = "_AcceleratorConnector._check_and_init_precision"
_FABRIC = "_Connector._check_and_init_precision"
KNOWN = {
    "lightning.pytorch.trainer.connectors.accelerator_connector": (_METHOD,),
    "pytorch_lightning.trainer.connectors.accelerator_connector": (_METHOD,),
    "lightning.fabric.connector": (_FABRIC,),
    "lightning_fabric.connector": (_FABRIC,),
}


def install(module, set_attr, tell) -> str:
    from .active import emulating

    fabric = hasattr(module, "_Connector")
    cls = module._Connector if fabric else module._AcceleratorConnector
    flag = "_precision_input" if fabric else "_precision_flag"
    original = cls._check_and_init_precision

    @functools.wraps(original)
    def _check_and_init_precision(self):
        accelerator = self._accelerator_flag
        cpu = accelerator == "cpu" or type(accelerator).__name__ == "CPUAccelerator"
        if not (emulating() and getattr(self, flag, None) == "16-mixed" and cpu):
            return original(self)
        self._accelerator_flag = "cuda"  # what the connector decides from; the accelerator itself stays the CPU's
        try:
            plugin = original(self)
        finally:
            self._accelerator_flag = accelerator
        if getattr(plugin, "device", None) == "cuda" and getattr(plugin, "precision", None) == "16-mixed":
            scaler = getattr(plugin, "scaler", None)
            tell(
                f"--emulate-fp16 [lightning]: {'Fabric' if fabric else 'Trainer'}(precision='16-mixed') on a CPU "
                f"takes its CUDA float16 path: MixedPrecision('16-mixed', 'cuda'), scaler "
                f"{type(scaler).__name__}('cuda') on the CPU, tensors on the CPU"
            )
        return plugin

    set_attr(cls, "_check_and_init_precision", _check_and_init_precision)
    return f"--emulate-fp16: Lightning {'Fabric' if fabric else 'Trainer'} 16-mixed on a CPU will take the CUDA float16 path (integration ready)"
