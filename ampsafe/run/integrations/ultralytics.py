"""--emulate-fp16 for ultralytics (``model.train(..., amp=True)``) on a CPU.

ultralytics' trainer enables AMP only when ``check_amp(model)`` passes, and ``check_amp`` returns False for a
model on a CPU; its autocast (``ultralytics.utils.torch_utils.autocast``) asks for the trainer's device type,
"cpu", whose op lists are not CUDA's. For a float16 run on a CPU (``amp=True``, not ``"bf16"``) this answers
``check_amp`` as a GPU that passed would, and has the trainer's ``autocast(True, device="cpu")`` enter
``torch.amp.autocast("cuda")`` (the emulation: CPU float16 with CUDA's op lists). Its ``GradScaler("cuda",
enabled=True)`` is then ampsafe's, scaling on the CPU. Validation during training stays float32, as
ultralytics keeps it on a CPU. Only the trainer module's own names are patched.
"""

from __future__ import annotations

import functools

TARGETS = ("ultralytics.engine.trainer",)
KNOWN = {"ultralytics.engine.trainer": ("check_amp", "autocast", "BaseTrainer")}


def install(module, set_attr, tell) -> str:
    from .active import emulating

    original_check = module.check_amp
    original_autocast = module.autocast

    @functools.wraps(original_check)
    def check_amp(model, *args, **kwargs):
        device = next(iter(model.parameters()), None)
        if emulating() and device is not None and device.device.type == "cpu":
            tell(
                "--emulate-fp16 [ultralytics]: check_amp passes for a model on a CPU and the trainer's autocast "
                "is autocast('cuda'): amp=True trains in float16 with ampsafe's GradScaler('cuda') on the CPU"
            )
            return True
        return original_check(model, *args, **kwargs)

    @functools.wraps(original_autocast)
    def autocast(enabled, device: str = "cuda"):
        if emulating() and device == "cpu" and enabled is True:
            device = "cuda"
        return original_autocast(enabled, device=device)

    set_attr(module, "check_amp", check_amp)
    set_attr(module, "autocast", autocast)
    return "--emulate-fp16: ultralytics amp=True on a CPU will take the CUDA float16 path (integration ready)"
