"""torch float16 CUDA AMP on a CPU for a script you don't edit (``ampsafe run --emulate-fp16``).

On a machine without CUDA, ``torch.autocast("cuda")`` and ``torch.cuda.amp.GradScaler()`` print "Disabling"
and do nothing. After :func:`install` (and only where ``torch.cuda.is_available()`` is False: on a CUDA
machine nothing is patched):

* ``torch.autocast("cuda", ...)``, ``torch.amp.autocast("cuda", ...)`` and ``torch.cuda.amp.autocast(...)`` are
  CPU autocast: ``autocast.__init__`` (the one class behind all three) maps device ``"cuda"`` to ``"cpu"``.
  The dtype is the script's, else ``torch.get_autocast_dtype("cuda")`` (float16 by default; CPU autocast's own
  default would be bfloat16); ``enabled=False`` and ``cache_enabled`` are honoured, as are nested blocks.
* CPU autocast's op lists are not CUDA's: on the CPU ``exp``, ``log``, ``pow``, ``softmax``, ``log_softmax``,
  ``layer_norm``, ``group_norm``, ``sum``, ``cumsum``, ``interpolate``, ... follow their float16 input, where
  CUDA computes them in float32, and ``mv``, ``addmv``, ``addr`` and the RNN cells stay float32, where CUDA
  runs them in float16 (measured on torch 2.14; the lists are :mod:`ampsafe.torch.ops`'). So while an
  emulated block is entered, a ``TorchFunctionMode`` applies the difference: for those ops it casts the
  low-precision inputs to float32 (or the float32 inputs to the block's dtype), and CPU autocast does the
  rest. It acts only while CPU autocast is enabled (so a nested ``enabled=False`` block is plain float32) and
  leaves in-place variants alone. The same mode computes the matrix ops (conv, linear, matmul, mm, bmm,
  addmm, baddbmm) as a GPU's float16 kernels do: operands rounded to the block's dtype, float32 accumulation
  (here float32 oneDNN/BLAS), the result rounded back, and their gradients through the same casts, so values
  past 65504 overflow in both passes (an ``out=`` call fills the caller's buffer: TRL's chunked log-prob
  loss); CPU float16 kernels are reference ones (a Faster R-CNN step ~3x slower).
* ``torch.amp.GradScaler("cuda")`` and ``torch.cuda.amp.GradScaler()`` are ``"cpu"`` scalers, which scale:
  ``GradScaler.__init__`` maps the device the same way. When ``ampsafe.auto`` has put ampsafe's scaler in
  place of torch's, it calls :func:`map_device` on the device it passes.

* ``torch.utils.checkpoint`` recomputes a checkpointed forward during the backward under the autocast state it
  read in the forward (``_get_autocast_kwargs``: CPU autocast, float16). Read inside an emulated block, that
  state also carries the block's CUDA op lists, so the recompute casts as the forward did (without them its
  tensors' dtypes differ and the checkpoint raises ``CheckpointError``: HF ``gradient_checkpointing=True``, TRL's
  ``SFTConfig`` default).

Tensors stay where the script puts them (on a CPU), and ``torch.cuda.is_available()`` is not touched, so the
script must already run on a CPU. :func:`install` returns lines for the run's banner; :func:`uninstall`
restores every patched attribute (idempotent).
"""

from __future__ import annotations

import functools
import threading

from ..core.ledger import AttrPatches

__all__ = ["install", "uninstall", "active", "map_device"]

_lock = threading.RLock()
_inside = threading.local()  # .depth: the emulated blocks entered (with their op lists) in this thread
_CUDA_LISTS = "_ampsafe_cuda_lists"  # the key a checkpoint's saved CPU autocast state carries the op lists by
# this emulator's patches of torch, in the process ledger (core.ledger)
_originals = AttrPatches("ampsafe.torch.cuda_emulation")
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


# the matrix ops an emulated block computes in float32 on operands rounded to the block's dtype, the result rounded
# back to it: a GPU's float16 GEMM / convolution (float32 accumulation), and the gradients pass through the same casts
_GEMM_OPS = frozenset(
    {
        "conv1d",
        "conv2d",
        "conv3d",
        "conv_transpose1d",
        "conv_transpose2d",
        "conv_transpose3d",
        "linear",
        "matmul",
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
    }
)

# python-level names of ops whose canonical name (ampsafe.torch.ops) differs, or that compose listed ones
_ALIASES = {
    "pow": ("__rpow__",),
    "interpolate": ("upsample", "upsample_nearest", "upsample_bilinear"),
    "linalg_vector_norm": ("linalg_norm",),
    "log_softmax": ("cross_entropy",),  # log_softmax + nll_loss: both float32 on CUDA
}


@functools.lru_cache(maxsize=1)
def _list_difference() -> tuple[frozenset[str], frozenset[str]]:
    """(ops CUDA computes in float32 and CPU autocast does not, ops CUDA lowers and CPU autocast does not)."""
    from .ops import autocast_fp16_ops, autocast_fp32_ops

    def named(ops):
        return frozenset(ops) | {alias for op in ops for alias in _ALIASES.get(op, ())}

    to_fp32 = autocast_fp32_ops("cuda") - autocast_fp32_ops("cpu")
    to_low = autocast_fp16_ops("cuda", "O1") - autocast_fp16_ops("cpu", "O1")
    return named(to_fp32), named(to_low)


@functools.lru_cache(maxsize=1)
def _cuda_lists_class():
    """A TorchFunctionMode class that makes CPU autocast follow CUDA autocast's lists (see the module docstring)."""
    import torch
    from torch.overrides import TorchFunctionMode

    from .tensors import LOW_DTYPES as low

    to_fp32, to_low = _list_difference()

    def cast(value, want, source):
        if isinstance(value, torch.Tensor):
            return value.to(want) if value.dtype in source else value
        if isinstance(value, (list, tuple)):
            return type(value)(cast(v, want, source) for v in value)
        return value

    def rounded(value, want):
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value.to(want).float()
        if isinstance(value, (list, tuple)):
            return type(value)(rounded(v, want) for v in value)
        return value

    class CudaAutocastLists(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = getattr(func, "__name__", "")
            if name in _GEMM_OPS and torch.is_autocast_enabled("cpu"):
                # as a GPU computes them: low-precision operands, float32 accumulation, a low-precision result
                # (CPU float16 kernels are the slow reference ones; this is float32 oneDNN/BLAS on rounded values)
                want = torch.get_autocast_dtype("cpu")
                out = kwargs.pop("out", None)
                want = kwargs.pop("out_dtype", None) or want
                if out is None:
                    args = rounded(args, want)
                    kwargs = {k: rounded(v, want) for k, v in kwargs.items()}
                else:  # an out= variant: autocast leaves its operands alone, the result lands in the caller's buffer
                    args = cast(args, torch.float32, low)
                    kwargs = {k: cast(v, torch.float32, low) for k, v in kwargs.items()}
                with torch.autocast("cpu", enabled=False):
                    result = func(*args, **kwargs)
                if out is not None:
                    return out.copy_(result)
                return result.to(want) if isinstance(result, torch.Tensor) and result.is_floating_point() else result
            if (name in to_fp32 or name in to_low) and torch.is_autocast_enabled("cpu"):
                if name in to_fp32:
                    want, source = torch.float32, low
                else:
                    want, source = torch.get_autocast_dtype("cpu"), (torch.float32,)
                args = cast(args, want, source)
                kwargs = {k: cast(v, want, source) for k, v in kwargs.items()}
            return func(*args, **kwargs)

    CudaAutocastLists.__module__ = __name__
    return CudaAutocastLists


def _autocast_init(original):
    @functools.wraps(original)
    def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None, **saved):
        emulated = map_device(device_type) != device_type or bool(saved.pop(_CUDA_LISTS, False))
        if saved:
            raise TypeError(f"autocast.__init__() got unexpected keyword arguments {sorted(saved)}")
        if emulated:
            import torch

            if dtype is None:
                dtype = torch.get_autocast_dtype("cuda")
            device_type = "cpu"
        original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        self._ampsafe_modes = [] if emulated else None

    return __init__


def _autocast_enter(original):
    @functools.wraps(original)
    def __enter__(self):
        result = original(self)
        modes = getattr(self, "_ampsafe_modes", None)
        if modes is not None and self._enabled:
            mode = _cuda_lists_class()()
            mode.__enter__()
            modes.append(mode)
            _inside.depth = getattr(_inside, "depth", 0) + 1
        return result

    return __enter__


def _autocast_exit(original):
    @functools.wraps(original)
    def __exit__(self, exc_type, exc_val, exc_tb):
        modes = getattr(self, "_ampsafe_modes", None)
        if modes:
            modes.pop().__exit__(exc_type, exc_val, exc_tb)
            _inside.depth -= 1
        return original(self, exc_type, exc_val, exc_tb)

    return __exit__


def _checkpoint_autocast_kwargs(original):
    """``torch.utils.checkpoint._get_autocast_kwargs``: inside an emulated block, the CPU state it saves for the
    recompute also enters the block's op lists (the key :func:`_autocast_init` takes)."""

    @functools.wraps(original)
    def _get_autocast_kwargs(*args, **kwargs):
        device_kwargs, cpu_kwargs = original(*args, **kwargs)
        if getattr(_inside, "depth", 0) and cpu_kwargs.get("enabled"):
            cpu_kwargs = {**cpu_kwargs, _CUDA_LISTS: True}
        return device_kwargs, cpu_kwargs

    return _get_autocast_kwargs


def _scaler_init(original):
    @functools.wraps(original)
    def __init__(self, device="cuda", *args, **kwargs):
        return original(self, map_device(device), *args, **kwargs)

    return __init__


def _patch(owner, attr: str, value) -> None:
    _originals.set(owner, attr, value)


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
        import torch.utils.checkpoint as checkpoint

        if torch.cuda.is_available():
            return ["torch: CUDA is available, so torch.autocast('cuda') and GradScaler('cuda') are left as they are"]
        autocast = autocast_mode.autocast
        _patch(autocast, "__init__", _autocast_init(autocast.__init__))
        _patch(autocast, "__enter__", _autocast_enter(autocast.__enter__))
        _patch(autocast, "__exit__", _autocast_exit(autocast.__exit__))
        _patch(grad_scaler.GradScaler, "__init__", _scaler_init(grad_scaler.GradScaler.__init__))
        _patch(checkpoint, "_get_autocast_kwargs", _checkpoint_autocast_kwargs(checkpoint._get_autocast_kwargs))
        _state["installed"] = True
        return [
            "torch.autocast('cuda') / torch.amp.autocast('cuda') / torch.cuda.amp.autocast -> CPU autocast in "
            "float16 (the script's dtype if it gives one), with CUDA autocast's op lists",
            "torch.amp.GradScaler('cuda') / torch.cuda.amp.GradScaler -> GradScaler('cpu'): it scales the loss",
        ]


def uninstall() -> None:
    """Restore every patched attribute (idempotent)."""
    with _lock:
        _originals.restore()
        _state["installed"] = False
