"""Paddle float16 AMP on a CPU for a script you don't edit (``ampsafe run --emulate-fp16``).

PaddlePaddle's CPU build has no AMP: ``paddle.amp.auto_cast``, ``paddle.amp.decorate`` and
``paddle.amp.GradScaler`` turn themselves off on a CPU place. After :func:`install`, on a CPU place:

* every ``paddle.amp.auto_cast(...)`` block (also ``paddle.amp.amp_guard``, ``paddle.amp.autocast``,
  ``paddle.autocast``: they all run the module global ``paddle.amp.auto_cast.amp_guard``, which is what is
  replaced) runs under :func:`ampsafe.paddle.emulate_fp16` at the block's ``level``, with its
  ``custom_white_list`` / ``custom_black_list`` and ``use_promote``. ``enable=False`` and ``level="O0"``
  blocks run in float32, also inside an emulated block (only the innermost block decides).
  ``dtype="bfloat16"`` blocks are not emulated: they run in float32, with a warning (bfloat16 has float32's
  exponent range, so it cannot overflow as float16 does). ``level="OD"`` is not emulated either (warning).
  Paddle's own ``amp_guard`` still runs around the block, so ``amp_global_state().amp_dtype`` is the block's
  dtype as on a GPU (Paddle's scaler reads it); Paddle's tracer itself stays at O0, so
  ``paddle.amp.is_autocast_enabled()`` is False inside.
* ``paddle.amp.decorate`` / ``amp_decorate`` return the script's models and optimizers unchanged (their
  parameters stay float32: they are the float32 master weights) and record the models and the level. At O2
  they mark ``excluded_layers`` exactly as Paddle's ``decorate`` does on a GPU (``_cast_to_low_precision =
  False``; restored by :func:`uninstall`), and the emulator's O2 rounds every other parameter that Paddle
  would cast (``need_keep_fp32``: not the norm layers) through float16 at each use: float16 weights with
  float32 master weights, which is ``master_weight=None/True``. ``master_weight=False`` (float16 updates),
  ``save_dtype`` and ``master_grad`` are not emulated.
* ``paddle.amp.GradScaler`` (Paddle's own class, and ``AmpScaler``) is enabled as on a GPU: its
  ``AmpScaler.__init__`` is wrapped so that the CPU-place check it makes while it is built sees a GPU place;
  everything else is Paddle's code. When ``ampsafe.auto`` has put ampsafe's scaler in place of Paddle's,
  that scaler asks :func:`active` instead.

Which model an ``auto_cast`` block emulates (the O2 weights are that model's): the models given to the latest
``decorate(models=...)``; else the smallest layer owning every parameter of the live optimizers
(``Backend.owner_of``; several optimizers over separate models: all of those models); else the live root layer
with the most parameters. At O1 the model only names what is reported. That resolution walks the garbage
collector's objects, so it is cached, weakly: it is made again at the first block after a new optimizer is built
(``Optimizer.__init__`` counts them) or after a resolved model died. A process that trains several models one after
the other (a sweep, k-fold, a notebook) thus emulates each block for the model trained now, and no model is kept
alive by the emulation: neither by that cache nor by an emulator (a block's emulator holds its model weakly; its
O2 float16 parameters are dropped with the model).
The block's level decides, as the emulator defines its levels (O2 = decorate + ``auto_cast(level='O2')``): an
O2 block without ``decorate(level='O2')`` gets float16 weights anyway, and an O1 block after it float32
weights; each says so once in a warning (on a GPU the weights are what decorate made them).

PaddleDetection's ``ppdet.engine.Trainer`` computes ``enable`` of its ``GradScaler`` and of every ``auto_cast``
from its config (``enable=cfg.use_gpu or cfg.use_npu or cfg.use_mlu``), and on a CPU build ``use_gpu`` must be
false (ppdet's ``check_gpu`` exits otherwise), so its AMP is off on a CPU even with ``--amp``. The emulation's
purpose is that the script's AMP behaves as on a GPU, so :func:`install_ppdet` (called by :func:`install` when
ppdet's trainer is already imported, else by ``ampsafe.auto`` right after it is) makes a Trainer with ``amp``
on (and the semi-supervised trainers of ``ppdet.engine.trainer_ssod``, whose training and evaluation loops are
their own) run ``train`` / its evaluation loops with ``cfg.use_gpu`` read as true on an emulating place, which is
what those ``enable`` expressions see on a GPU (in those files ``use_gpu`` only enables AMP, and ``sync_bn`` with
more than one rank). The device stays the CPU; a Trainer without ``amp`` is untouched; a literal
``auto_cast(enable=False)`` anywhere else stays float32.

On a GPU place nothing changes: the originals run. :func:`install` returns lines for the run's banner;
:func:`uninstall` restores every patched attribute (idempotent).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import sys
import threading
import warnings
import weakref

from ..core.ledger import AttrPatches
from ..core.live_objects import live_objects

__all__ = ["install", "install_ppdet", "uninstall", "active", "current", "last", "summary", "amp_less_place"]

_lock = threading.RLock()
# this emulator's patches of Paddle and ppdet, in the process ledger (core.ledger)
_originals = AttrPatches("ampsafe.paddle.amp_emulation")
# (weakref to a layer, its _cast_to_low_precision before decorate(excluded_layers=...) marked it)
_layer_flags: list[tuple[weakref.ref, bool]] = []
_state: dict = {}


def _reset_state() -> None:
    _state.clear()
    _state.update(
        installed=False,
        models=None,  # weakrefs to the models of the latest decorate()
        decorate_level=None,
        owner=None,  # the cached resolution: (weakrefs to its models, source, optimizers_built when made)
        optimizers_built=0,  # paddle.optimizer.Optimizer instances built since install (the cache's trigger)
        blocks=0,
        emulated_blocks=0,
        not_emulated={},  # reason -> count
        last=None,
        warned=set(),
        ppdet_as_gpu=0,  # ppdet Trainer calls run with cfg.use_gpu read as true (install_ppdet)
        ppdet_trainers=[],  # the Trainer classes install_ppdet patched
        empty=None,  # the empty layer a block without any live layer resolved to
    )


_reset_state()


class _Local(threading.local):
    def __init__(self):
        self.blocks: list = []  # this thread's open auto_cast blocks, innermost last (an emulator or None)


_local = _Local()


def active() -> bool:
    """True while :func:`install` is in force: scripts' AMP on a CPU is emulated as float16 AMP on a GPU."""
    return bool(_state["installed"])


def current():
    """The emulator of this thread's innermost open ``auto_cast`` block (an ``Fp16Emulator``), or None (none
    open, or the innermost one runs in float32: ``enable=False``, bfloat16, ...)."""
    return _local.blocks[-1] if _local.blocks else None


def last():
    """The emulator of the most recent emulated ``auto_cast`` block (its ``emulated``, ``counts``, ``report()``).
    It holds its model weakly: ``last().model`` is None once the script dropped that model."""
    return _state["last"]


def summary() -> dict:
    """Blocks seen, emulated, and not emulated (by reason); how the model used was found."""
    owner = _state["owner"]
    return {
        "active": active(),
        "blocks": _state["blocks"],
        "emulated_blocks": _state["emulated_blocks"],
        "not_emulated": dict(_state["not_emulated"]),
        "decorate_level": _state["decorate_level"],
        "model_source": owner[1] if owner else ("decorate" if _state["models"] else None),
        "ppdet_as_gpu": _state["ppdet_as_gpu"],
    }


# --------------------------------------------------------------------------------------------- helpers


def amp_less_place():
    """The tracer's place when Paddle's AMP turns itself off there (dynamic graph, not a GPU / XPU / custom
    place: a CPU), as Paddle's ``AmpScaler.__init__`` checks it; else None. This module emulates there."""
    import paddle
    from paddle.base.framework import _dygraph_tracer

    if not paddle.in_dynamic_mode():
        return None
    tracer = _dygraph_tracer()
    if tracer is None:
        return None
    place = tracer._expected_place
    if place.is_gpu_place() or place.is_xpu_place() or place.is_custom_place():
        return None
    return place


def _emulating_place() -> bool:
    return amp_less_place() is not None


def _warn_once(key: str, message: str, stacklevel: int = 4) -> None:
    """A RuntimeWarning once per process (per install); ``stacklevel`` 4 is the script's ``with`` line when
    called from the amp_guard generator."""
    if key in _state["warned"]:
        return
    _state["warned"].add(key)
    warnings.warn(f"ampsafe: {message}", RuntimeWarning, stacklevel=stacklevel)


def _not_emulated(reason: str) -> None:
    counts = _state["not_emulated"]
    counts[reason] = counts.get(reason, 0) + 1


def _emulator_class():
    from .emulate import Fp16Emulator

    class BlockEmulator(Fp16Emulator):
        """``Fp16Emulator`` of one ``auto_cast`` block: it acts only while its block is this thread's innermost,
        so a nested block (``enable=False``, other lists) decides alone.

        Its models are held weakly, and its O2 float16 parameters are dropped when one of them dies: :func:`last`
        and a scaler's capture (which keeps the emulator of the latest forward, for replays) keep no model alive.
        ``model``: the model, several joined in a ``LayerList`` (a new one at each read), None once one died.
        """

        def __init__(self, models: list, *args, **kwargs):
            emulator = weakref.ref(self)

            def dead(_ref) -> None:
                alive = emulator()
                if alive is not None:
                    alive._fp16_params = {}

            self._models = [weakref.ref(m, dead) for m in models]
            super().__init__(_several(models), *args, **kwargs)

        @property
        def model(self):
            models = [ref() for ref in self._models]
            return None if any(m is None for m in models) else _several(models)

        @model.setter
        def model(self, _joined) -> None:
            """``Fp16Emulator.__init__`` sets it: the models are the weak ones recorded before."""

        def __call__(self, op, func, args, kwargs):
            blocks = _local.blocks
            if not blocks or blocks[-1] is not self:
                return func(*args, **kwargs)
            return super().__call__(op, func, args, kwargs)

        def __enter__(self):
            """Re-open this block (a scaler replaying the captured forward at its floor runs it as the step
            did, after the script's own ``auto_cast`` block has closed)."""
            _local.blocks.append(self)
            try:
                return super().__enter__()
            except BaseException:
                _local.blocks.pop()
                raise

        def __exit__(self, *exc):
            try:
                super().__exit__(*exc)
            finally:
                blocks = _local.blocks
                if blocks and blocks[-1] is self:
                    blocks.pop()

    BlockEmulator.__module__ = __name__
    return BlockEmulator


def _several(models: list):
    """One layer over several models (the emulator walks a model's sublayers for its O2 weights)."""
    import paddle

    return models[0] if len(models) == 1 else paddle.nn.LayerList(models)


def _cached_owner():
    """The cached resolution as (models, source), or None when there is none, a new optimizer was built since it
    was made, or one of its models died."""
    cached = _state["owner"]
    if cached is None:
        return None
    refs, source, built = cached
    models = [ref() for ref in refs]
    if built != _state["optimizers_built"] or any(m is None for m in models):
        return None
    return models, source


def _resolve_model():
    """(models, source) for an auto_cast block: decorate's models, else the owners of the optimizers' parameters,
    else the live root layer with the most parameters, else an empty layer; cached weakly (see the module
    docstring)."""
    import paddle

    from ..core.backend import live_roots
    from ..core.model import unwrap
    from .backend import BACKEND as backend  # this package's own Backend: below this module, never the registry

    models = [m for m in (ref() for ref in _state["models"] or []) if m is not None]
    if models:
        return [unwrap(m) for m in models], "decorate"
    cached = _cached_owner()
    if cached is not None:
        return cached
    if _state["owner"] is not None:
        gc.collect()  # a model or an optimizer dropped in a reference cycle must not be found again
    built = _state["optimizers_built"]
    roots = live_roots(backend)
    optimizers = live_objects(paddle.optimizer.Optimizer)
    owners: dict[int, object] = {}
    for optimizer in optimizers:
        owner = backend.owner_of(optimizer, roots)
        if owner is not None:
            owners.setdefault(id(owner), owner)
    # an owner inside another owner adds nothing: keep the outermost ones
    inner = {id(s) for o in owners.values() for s in o.sublayers()}
    owners = [o for key, o in owners.items() if key not in inner]
    if owners:
        models, source = owners, "optimizer"
    else:
        best = max(roots, key=lambda m: len(backend.parameters(m)), default=None)
        models, source = ([best], "largest live layer") if best is not None else ([paddle.nn.Layer()], "none")
    _state["owner"] = (tuple(weakref.ref(m) for m in models), source, built)
    if source == "none":
        _state["empty"] = models[0]  # no model at all: this empty layer is the resolution, kept here
    return models, source


# --------------------------------------------------------------------------------------------- the patches


def _amp_guard(original):
    BlockEmulator = _emulator_class()

    @contextlib.contextmanager
    def amp_guard(
        enable=True,
        custom_white_list=None,
        custom_black_list=None,
        level="O1",
        dtype="float16",
        use_promote=True,
    ):
        if not _emulating_place():
            with original(enable, custom_white_list, custom_black_list, level, dtype, use_promote):
                yield
            return
        with contextlib.ExitStack() as stack:
            with warnings.catch_warnings():  # the "amp_guard can only be enabled on CUDAPlace" note: emulated here
                warnings.filterwarnings("ignore", message="amp_guard can only be enabled on")
                stack.enter_context(original(enable, custom_white_list, custom_black_list, level, dtype, use_promote))
            _state["blocks"] += 1
            norm_level = str(level).upper()
            norm_dtype = getattr(dtype, "name", dtype).lower()
            emulator = None
            if not enable or norm_level == "O0":
                _not_emulated("disabled")
            elif norm_dtype == "bfloat16":
                _not_emulated("bfloat16")
                _warn_once(
                    "bfloat16",
                    "paddle.amp.auto_cast(dtype='bfloat16') is not emulated on this CPU: the block runs in float32 "
                    "(bfloat16 has float32's exponent range, so it cannot overflow as float16 does)",
                )
            elif norm_level == "OD":
                _not_emulated("OD")
                _warn_once("OD", "paddle.amp.auto_cast(level='OD') is not emulated: the block runs in float32")
            else:
                models, _source = _resolve_model()
                _check_levels(norm_level)
                emulator = BlockEmulator(
                    models,
                    norm_level,
                    use_promote=use_promote,
                    custom_white_list=custom_white_list,
                    custom_black_list=custom_black_list,
                )
                _state["emulated_blocks"] += 1
                _state["last"] = emulator
            blocks = _local.blocks
            blocks.append(emulator)
            depth = len(blocks)
            try:
                if emulator is not None:
                    from .intercept import op_mode

                    stack.enter_context(op_mode(emulator))
                yield
            finally:
                del blocks[depth - 1 :]

    return functools.wraps(original)(amp_guard)


def _check_levels(block_level: str) -> None:
    """Say once where a block's level and decorate's differ: the emulator's O2 is decorate + auto_cast O2."""
    decorated = _state["decorate_level"] == "O2"
    if block_level == "O2" and not decorated:
        _warn_once(
            "O2-undecorated",
            "auto_cast(level='O2') without paddle.amp.decorate(level='O2') is emulated as if the model were "
            "decorated (float16 weights); on a GPU its weights would stay float32",
            stacklevel=5,
        )
    elif block_level == "O1" and decorated:
        _warn_once(
            "O1-decorated",
            "auto_cast(level='O1') after paddle.amp.decorate(level='O2') is emulated at O1 with float32 weights; "
            "on a GPU the decorated weights are float16",
            stacklevel=5,
        )


def _amp_decorate(original):
    @functools.wraps(original)
    def amp_decorate(
        models,
        optimizers=None,
        level="O1",
        dtype="float16",
        master_weight=None,
        save_dtype=None,
        master_grad=False,
        excluded_layers=None,
    ):
        result = original(models, optimizers, level, dtype, master_weight, save_dtype, master_grad, excluded_layers)
        if _emulating_place():
            _record_decorate(models, level, dtype, master_weight, excluded_layers)
        return result

    return amp_decorate


def _record_decorate(models, level, dtype, master_weight, excluded_layers) -> None:
    import paddle
    from paddle.amp.auto_cast import set_excluded_layers

    listed = list(models) if isinstance(models, (list, tuple)) else [models]
    _state["models"] = [weakref.ref(m) for m in listed]
    _state["decorate_level"] = level
    _state["owner"] = None
    if level != "O2":
        return
    if dtype == "bfloat16":
        _warn_once("bfloat16-decorate", "paddle.amp.decorate(dtype='bfloat16') is not emulated (weights stay float32)")
    if master_weight is False:
        _warn_once(
            "master_weight",
            "paddle.amp.decorate(master_weight=False) is emulated with float32 master weights (updates not rounded)",
        )
    excluded = excluded_layers if isinstance(excluded_layers, list) else [excluded_layers]
    touched = [*listed, *(e for e in excluded if isinstance(e, paddle.nn.Layer))]
    for root in touched:
        for layer in root.sublayers(include_self=True):
            _layer_flags.append((weakref.ref(layer), layer._cast_to_low_precision))
    set_excluded_layers(listed, excluded_layers)  # what decorate does on a GPU before casting


class _GpuPlace:
    """The place AmpScaler's constructor sees: its CPU check is the only thing it asks."""

    def __init__(self, place):
        self._place = place

    def is_gpu_place(self) -> bool:
        return True

    def __getattr__(self, name):
        return getattr(self._place, name)


class _TracerOnGpu:
    def __init__(self, tracer):
        self._tracer = tracer
        self._expected_place = _GpuPlace(tracer._expected_place)

    def __getattr__(self, name):
        return getattr(self._tracer, name)


def _optimizer_init(original):
    """Count the optimizers built: the next block resolves its model again (a new model is trained now).
    ``updated=()``: no marks of another party's wrapper are copied onto this one (``AttrPatches.wrap``)."""

    @functools.wraps(original, updated=())
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _state["optimizers_built"] += 1

    return __init__


def _scaler_init(original, grad_scaler_module):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        if not _emulating_place():
            return original(self, *args, **kwargs)
        with _lock:
            real = grad_scaler_module._dygraph_tracer
            grad_scaler_module._dygraph_tracer = lambda: _TracerOnGpu(real())
            try:
                return original(self, *args, **kwargs)
            finally:
                grad_scaler_module._dygraph_tracer = real

    return __init__


# ppdet.engine.trainer.Trainer methods whose AMP calls read ``enable`` from ``cfg.use_gpu`` (ppdet 2.6), and the
# modules whose Trainer subclasses define their own (trainer_ssod: Trainer_Semi_RTDETR's train, the semi-supervised
# trainers' evaluation loops)
PPDET_AMP_METHODS = ("train", "_eval_with_loader", "_eval_with_loader_slice")
PPDET_TRAINER_MODULES = ("ppdet.engine.trainer", "ppdet.engine.trainer_ssod")


def _ppdet_as_gpu(original):
    @functools.wraps(original)
    def method(self, *args, **kwargs):
        cfg = getattr(self, "cfg", None)
        if (
            not _state["installed"]
            or not getattr(self, "use_amp", False)
            or cfg is None
            or cfg.get("use_gpu")
            or not _emulating_place()
        ):
            return original(self, *args, **kwargs)
        cfg["use_gpu"] = True  # the Trainer's own copy of the config (Trainer.__init__ copies it)
        _state["ppdet_as_gpu"] += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            cfg["use_gpu"] = False

    return method


def install_ppdet(trainer_module=None) -> list[str]:
    """Make ppdet's ``Trainer`` and its subclasses with ``amp`` on enable their AMP on an emulating place as with
    ``use_gpu: true`` (see the module docstring): in ``trainer_module``, or in each of
    :data:`PPDET_TRAINER_MODULES` already imported, every class that is or subclasses the module's ``Trainer``
    gets the :data:`PPDET_AMP_METHODS` it defines itself wrapped. Nothing happens when :func:`install` is not in
    force, and a class is done once. Returns the banner line (empty when no class was new)."""
    with _lock:
        if not _state["installed"]:
            return []
        modules = (
            [trainer_module] if trainer_module is not None else [sys.modules.get(n) for n in PPDET_TRAINER_MODULES]
        )
        lines = []
        for module in modules:
            base = getattr(module, "Trainer", None)
            if not isinstance(base, type):
                continue
            done = []
            for cls in [c for c in vars(module).values() if isinstance(c, type) and issubclass(c, base)]:
                if cls.__module__ != module.__name__ or cls in _state["ppdet_trainers"]:
                    continue
                for name in PPDET_AMP_METHODS:
                    if name in vars(cls):
                        _patch(cls, name, _ppdet_as_gpu(vars(cls)[name]))
                _state["ppdet_trainers"].append(cls)
                done.append(cls.__name__)
            if done:
                lines.append(
                    f"ppdet.engine.{', '.join(done)} with amp: its GradScaler and auto_cast get enable=True as with "
                    "use_gpu: true (ppdet passes enable=cfg.use_gpu, false on a CPU); float16 emulated on this CPU"
                )
        return lines


def _patch(owner, attr: str, value) -> None:
    _originals.set(owner, attr, value)


# --------------------------------------------------------------------------------------------- public


def install() -> list[str]:
    """Emulate Paddle float16 AMP on a CPU for the script's ``auto_cast`` / ``decorate`` / ``GradScaler``.

    Returns the lines for the run's banner (empty when already installed: a second call changes nothing)."""
    with _lock:
        if _state["installed"]:
            return []
        import paddle
        import paddle.amp.auto_cast  # noqa: F401 (the submodule; ``paddle.amp.auto_cast`` is the function)
        import paddle.amp.grad_scaler as grad_scaler

        auto_cast = sys.modules["paddle.amp.auto_cast"]
        lines = []
        for name, wrap in (("amp_guard", _amp_guard), ("amp_decorate", _amp_decorate)):
            wrapped = wrap(getattr(auto_cast, name))
            _patch(auto_cast, name, wrapped)
            if getattr(paddle.amp, name, None) is not None:  # also exported under paddle.amp in some versions
                _patch(paddle.amp, name, wrapped)
        lines.append(
            "paddle.amp.auto_cast / amp_guard / autocast blocks -> ampsafe.paddle.emulate_fp16 at the block's level "
            "and custom lists (float16 storage emulated on this CPU; bfloat16 and enable=False blocks run in float32)"
        )
        lines.append(
            "paddle.amp.decorate -> records the models and level; O2: float16 weights (except norm layers and "
            "excluded_layers) emulated over float32 master weights"
        )
        _patch(grad_scaler.AmpScaler, "__init__", _scaler_init(grad_scaler.AmpScaler.__init__, grad_scaler))
        lines.append("paddle.amp.GradScaler -> enabled on this CPU as on a GPU (it scales the loss)")
        _patch(paddle.optimizer.Optimizer, "__init__", _optimizer_init(paddle.optimizer.Optimizer.__init__))
        _state["installed"] = True
        return lines + install_ppdet()


def uninstall() -> None:
    """Restore every patched attribute and the layers decorate marked; forget the recorded models (idempotent)."""
    with _lock:
        _originals.restore()
        while _layer_flags:
            ref, flag = _layer_flags.pop()
            layer = ref()
            if layer is not None:
                layer._cast_to_low_precision = flag
        _reset_state()
