"""torch float16 CUDA AMP on a CPU for a script you don't edit (``ampsafe run --emulate-fp16``).

On a machine without CUDA, ``torch.autocast("cuda")`` and ``torch.cuda.amp.GradScaler()`` print "Disabling"
and do nothing. After :func:`install` (and only where ``torch.cuda.is_available()`` is False: on a CUDA
machine nothing is patched):

* ``torch.autocast("cuda", ...)``, ``torch.amp.autocast("cuda", ...)`` and ``torch.cuda.amp.autocast(...)`` are
  CPU autocast: ``autocast.__init__`` (the one class behind all three) maps device ``"cuda"`` to ``"cpu"``.
  The dtype is the script's, else ``torch.get_autocast_dtype("cuda")`` (float16 by default; CPU autocast's own
  default would be bfloat16); ``enabled=False`` and ``cache_enabled`` are honoured, as are nested blocks.
  The op lists are CPU autocast's, which torch keeps close to CUDA's for float16 but not equal: measured on
  torch 2.14, ``mv``/``addmv`` stay float32 and ``exp``/``softmax`` follow their float16 input on the CPU,
  where CUDA casts them to float32.
* ``torch.amp.GradScaler("cuda")`` and ``torch.cuda.amp.GradScaler()`` are ``"cpu"`` scalers, which scale:
  ``GradScaler.__init__`` maps the device the same way. When ``ampsafe.auto`` has put ampsafe's scaler in
  place of torch's, it calls :func:`map_device` on the device it passes.

Tensors stay where the script puts them (on a CPU), and ``torch.cuda.is_available()`` is not touched, so the
script must already run on a CPU. :func:`install` returns lines for the run's banner; :func:`uninstall`
restores every patched attribute (idempotent).
"""

from __future__ import annotations

import functools
import threading

__all__ = ["install", "uninstall", "active", "map_device"]

_lock = threading.RLock()
# (owner, attribute, original value, whether the owner held it in its own __dict__)
_originals: list[tuple[object, str, object, bool]] = []
_state = {"installed": False}


def active() -> bool:
    """True while :func:`install` is in force: the script's CUDA AMP runs as CPU float16 AMP."""
    return bool(_state["installed"])


def map_device(device):
    """The device a GradScaler or autocast asked for, as emulated: ``"cuda"`` / ``"cuda:N"`` (a string or a
    ``torch.device``) -> ``"cpu"`` while :func:`active`; anything else, and everything when inactive, unchanged."""
    if not active():
        return device
    kind = getattr(device, "type", device)
    if isinstance(kind, str) and kind.split(":", 1)[0] == "cuda":
        return "cpu"
    return device


def _autocast_init(original):
    @functools.wraps(original)
    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if map_device(device_type) != device_type:
            import torch

            if dtype is None:
                dtype = torch.get_autocast_dtype("cuda")
            device_type = "cpu"
        return original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    return __init__


def _scaler_init(original):
    @functools.wraps(original)
    def __init__(self, device="cuda", *args, **kwargs):
        return original(self, map_device(device), *args, **kwargs)

    return __init__


def _patch(owner, attr: str, value) -> None:
    own = attr in vars(owner)
    _originals.append((owner, attr, getattr(owner, attr), own))
    setattr(owner, attr, value)


def install() -> list[str]:
    """Make the script's CUDA autocast and GradScaler run as CPU float16 AMP (only without CUDA).

    Returns the lines for the run's banner: empty when already installed (a second call changes nothing), one
    line saying nothing was changed on a machine with CUDA."""
    with _lock:
        if _state["installed"]:
            return []
        import torch
        import torch.amp.autocast_mode as autocast_mode
        import torch.amp.grad_scaler as grad_scaler

        if torch.cuda.is_available():
            return ["torch: CUDA is available, so torch.autocast('cuda') and GradScaler('cuda') are left as they are"]
        _patch(autocast_mode.autocast, "__init__", _autocast_init(autocast_mode.autocast.__init__))
        _patch(grad_scaler.GradScaler, "__init__", _scaler_init(grad_scaler.GradScaler.__init__))
        _state["installed"] = True
        return [
            "torch.autocast('cuda') / torch.amp.autocast('cuda') / torch.cuda.amp.autocast -> CPU autocast in "
            "float16 (the script's dtype if it gives one; CPU autocast's op lists)",
            "torch.amp.GradScaler('cuda') / torch.cuda.amp.GradScaler -> GradScaler('cpu'): it scales the loss",
        ]


def uninstall() -> None:
    """Restore every patched attribute (idempotent)."""
    with _lock:
        while _originals:
            owner, attr, value, own = _originals.pop()
            if own:
                setattr(owner, attr, value)
            else:
                delattr(owner, attr)
        _state["installed"] = False
