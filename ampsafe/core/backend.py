"""The one interface between ampsafe's framework-neutral logic and a framework: :class:`Backend`.

Why: scan, patch, watch, heal and ``ampsafe run`` all need the same few framework facts (module paths, what
model state a forward may move, how to run in float32, how to hook a forward). Each framework answers them
once, in its adapter package (``ampsafe.torch.backend.TorchBackend``, ``ampsafe.paddle.backend.PaddleBackend``);
``ampsafe._framework.backend_of(model)`` picks the instance, and nothing else asks which framework it is.
Pure Python: importing it imports neither torch nor paddle.

What a new framework supplies: one package ``ampsafe/<name>/`` whose ``backend.py`` defines one Backend class (a
subclass of :class:`BackendBase`, which writes the members that follow from the others) with its named parts, each
named once in its ``_package()`` (a :class:`Package`):

- ``backend.tensors``: a :class:`Tensors` (``<name>/tensors.py``, a subclass of :class:`TensorsBase`), every
  tensor fact the tracer, the watcher and the heal read;
- ``backend.amp``: an :class:`Amp` (a subclass of :class:`AmpBase`), the framework's AMP (its low dtypes, the
  float32 region, its levels, which ops compute in low precision, the precision a step ran in and how to replay
  it there);
- ``backend.swaps``: a :class:`~ampsafe.core.swaps.Swaps` (``<name>/patch.py``, a subclass of
  :class:`~ampsafe.core.swaps.SwapsBase`), the module facts the patch policies read and the mixins only the
  framework can write (its float32 island, its rescaled normalization).
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager as ContextManager
from contextlib import ExitStack, contextmanager, nullcontext
from functools import cached_property
from types import ModuleType
from typing import Any, NamedTuple, Protocol

from . import amp as levels
from .graph import MASK_LIMIT, Graph
from .live_objects import live_objects
from .swaps import Swaps

log = logging.getLogger("ampsafe")

# ``Backend.replay``'s precision for a float32 run: no autocast, no float16 emulation, no grad, and the sharding's
# parameters in float32 (what tells a numerical error from a float16 one)
FLOAT32 = "float32"

__all__ = ["Backend", "BackendBase", "Package", "Tensors", "TensorsBase", "WeakIds", "Amp", "AmpBase", "Site"]
__all__ += ["NORM_STAT_NAMES", "FLOAT32", "owner_of", "live_roots"]


class Tensors(Protocol):
    """Every fact about one framework's tensors that ampsafe's shared logic reads: the tracer's recorder
    (:mod:`ampsafe.core.record`), the watcher (:mod:`ampsafe.core.watcher`) and the heal. ``backend.tensors``;
    stateless. The nested walks (``leaves`` and the two filtered ones), and every fact the framework's module
    answers in the spelling torch and Paddle share (``lib.Tensor``, ``lib.maximum``, ...), are written once in
    :class:`TensorsBase`."""

    lib: ModuleType  # the framework's top module (``torch``, ``paddle``): the base reads the shared spellings there
    tensor_type: type  # isinstance check for "a tensor of this framework"
    # |x| at or past it on the negative side is a mask's fill value: :meth:`lane_abs_max` leaves such lanes out
    mask_limit: float

    # -- nests
    def leaves(self, obj) -> list:
        """The tensors in a nest (a tensor, lists, tuples, namedtuples, dict values), in order: a model's output,
        an op's arguments, a loss. Anything else is no tensor and is skipped."""

    def float_leaves(self, obj) -> list:
        """The floating tensors of :meth:`leaves`, each once (by identity): the inputs and outputs of a traced op."""

    def checkable_leaves(self, obj) -> list:
        """The tensors of :meth:`leaves` whose values can be checked (:meth:`checkable`), duplicates kept: what
        the watcher checks for non-finite values."""

    # -- what a tensor is
    def is_float(self, t) -> bool:
        """A floating tensor: only these carry the values AMP can overflow."""

    def checkable(self, t) -> bool:
        """A floating tensor with values on a device (torch's meta and sparse tensors have none to check)."""

    def numel(self, t) -> int: ...

    def is_batched(self, t) -> bool:
        """Whether ``t``'s float16-ness counts for type promotion (a scalar's does not)."""

    def describe(self, t) -> tuple[tuple, str]:
        """(shape, dtype name without the framework prefix), as reports spell them."""

    # -- identity
    def id_map(self) -> Any:
        """A mapping keyed weakly by tensor (``get`` / ``[t] = ...``), never by a recycled ``id()``."""

    def version(self, t) -> int:
        """The tensor's in-place write counter: a write the tracer did not see changes it."""

    def key(self, t) -> int:
        """Identity of the tensor's data, stable while it lives: the watcher recognises parameters and model
        inputs by it (torch: the storage, which views and ``detach()`` share; a framework without one: the
        tensor object)."""

    # -- values
    def finite(self, t) -> bool:
        """No inf and no NaN in ``t`` (an empty tensor is finite); one host sync."""

    def grads_finite(self, params, loss=None) -> bool:
        """The loss (a nest of tensors, or None) and the gradients of all ``params`` finite, in one host sync: the
        check of a step that ``ampsafe run``'s FP32 guard and ``watch(guard=True)`` skip when it fails."""

    def grad_norm(self, params) -> float | None:
        """The 2-norm of ``params``' gradients in float32 (None: none has a gradient), one host sync: the unscaled
        gradient norm ``ampsafe run``'s headroom sampler records."""

    def to_numpy(self, t):
        """float32 host copy of a floating tensor, for stats and sample rows; None for anything else."""

    def abs_max(self, t):
        """max |t| as a 0-d float32 device tensor, no host sync: the tracer measures every op output with it and
        syncs once at the end. float32 so maxima of float16 and float32 tensors combine with :meth:`maximum`."""

    def lane_abs_max(self, t):
        """:meth:`abs_max` over the lanes that are not a mask's fill value (``t <= -MASK_LIMIT``: ``finfo.min``,
        ``-inf``, and whatever fill the framework's own attention uses); NaN lanes count."""

    def maximum(self, a, b):
        """Elementwise max of two device scalars (no host sync)."""

    def to_floats(self, scalars: list) -> list[float]:
        """Host values of 0-d float32 device tensors, in one sync."""

    def assign(self, targets: list, values: list) -> None:
        """Write each of ``values`` into the tensor of ``targets`` beside it, in place, outside autograd: a snapshot's
        restore and a statistics reset keep the tensor objects the model (and an optimizer) hold."""

    # -- autograd
    def no_grad(self) -> ContextManager:
        """Measurements made inside are no part of the model's autograd graph."""

    def requires_grad(self, t) -> bool: ...

    def grad_hook(self, t, fn: Callable) -> Any:
        """Register ``fn(grad)`` on ``t``'s floating gradient; a handle with ``remove()``, or None when ``t`` has
        no gradient (yet) to hook."""

    def custom_function(self, t) -> str | None:
        """The name of the custom autograd Function that made ``t``, if any: the tracer cannot see inside it."""


class TensorsBase:
    """The :class:`Tensors` members written once: the nested walks over the framework's ``tensor_type``, the facts
    its module ``lib`` spells as torch and Paddle both do (``lib.Tensor``, ``lib.is_floating_point``,
    ``lib.isfinite``, ``lib.maximum``, ``lib.stack``, ``lib.no_grad``, ``Tensor.to(dtype)``, ``Tensor.detach()``),
    and the facts that hold unless a framework says otherwise. A framework whose module spells one otherwise, or
    that has a faster way, writes that member."""

    lib: ModuleType
    mask_limit: float = MASK_LIMIT

    @property
    def tensor_type(self) -> type:
        return self.lib.Tensor

    @property
    def no_grad(self) -> Callable[[], ContextManager]:
        return self.lib.no_grad

    @property
    def maximum(self) -> Callable:
        return self.lib.maximum

    def is_float(self, t) -> bool:
        return self.lib.is_floating_point(t)

    def checkable(self, t) -> bool:
        return self.is_float(t)  # a framework whose tensors may hold no values (torch's meta) says so

    def numel(self, t) -> int:
        return math.prod(self.describe(t)[0])

    def describe(self, t) -> tuple[tuple, str]:
        return tuple(t.shape), str(t.dtype).removeprefix(f"{self.lib.__name__}.")

    def id_map(self) -> Any:
        return WeakIds()

    def key(self, t) -> int:
        return id(t)  # a framework without a storage pointer: the tensor object

    def custom_function(self, t) -> str | None:
        return None  # a tracer that cannot tell a custom Function's outputs apart

    def finite(self, t) -> bool:
        """One float32 sum instead of ``isfinite(t).all()`` (a full-size bool temporary, then a second reduction):
        ``--watch`` checks every op output with it, its hot path. The sum is non-finite iff an element is, or the
        finite elements' sum passes float32's range; only then does the exact check run, so a tensor of huge
        finite values is still finite."""
        if self.numel(t) == 0:
            return True
        lib = self.lib
        with self.no_grad():
            try:
                total = t.detach().sum(dtype=lib.float64 if t.dtype == lib.float64 else lib.float32)
            except Exception:  # noqa: BLE001 - a layout whose sum takes no dtype: the exact check decides
                total = None
            if total is not None and bool(lib.isfinite(total)):
                return True
            return bool(lib.isfinite(t).all())

    def to_numpy(self, t):
        if not isinstance(t, self.tensor_type) or not self.is_float(t):
            return None
        return t.detach().to(self.lib.float32).cpu().numpy()

    def abs_max(self, t):
        """Two reductions, no full-size ``|t|`` temporary."""
        m = self.maximum(t.max(), -t.min())
        return m if m.dtype == self.lib.float32 else m.to(self.lib.float32)

    def lane_abs_max(self, t):
        t = t.detach()
        return self.abs_max(self.lib.where(t <= -self.mask_limit, self.lib.zeros_like(t), t))

    def to_floats(self, scalars: list) -> list[float]:
        return self.to_numpy(self.lib.stack(scalars)).tolist()

    def grad_norm(self, params) -> float | None:
        grads = [p.grad.detach() for p in params if getattr(p, "grad", None) is not None]
        if not grads:
            return None
        squares = [(g.to(self.lib.float32) ** 2).sum() for g in grads]
        return float(self.lib.stack(squares).sum().sqrt())

    def leaves(self, obj) -> list:
        if isinstance(obj, self.tensor_type):
            return [obj]
        if isinstance(obj, dict):
            return [t for v in obj.values() for t in self.leaves(v)]
        if isinstance(obj, (list, tuple)):
            return [t for v in obj for t in self.leaves(v)]
        return []

    def float_leaves(self, obj) -> list:
        out: list = []
        for t in self.leaves(obj):
            if self.is_float(t) and not any(t is o for o in out):
                out.append(t)
        return out

    def checkable_leaves(self, obj) -> list:
        return [t for t in self.leaves(obj) if self.checkable(t)]


class WeakIds:
    """Tensor -> value, keyed by ``id()`` but checked through a weak reference, so a recycled id never aliases:
    :meth:`Tensors.id_map` for any framework whose tensors take weak references."""

    def __init__(self):
        self._entries: dict[int, tuple] = {}

    def get(self, t):
        entry = self._entries.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def __setitem__(self, t, value) -> None:
        key, entries = id(t), self._entries

        def forget(ref, key=key):
            entry = entries.get(key)
            if entry is not None and entry[0] is ref:
                del entries[key]

        entries[key] = (weakref.ref(t, forget), value)


class Amp(Protocol):
    """The framework's automatic mixed precision, as far as ampsafe reasons about it. ``backend.amp``."""

    low_dtypes: tuple  # the low-precision float dtypes AMP computes in (float16, bfloat16)
    # level -> (where, advice) for a level whose island line differs from the default one (Paddle O2: applied
    # after ``paddle.amp.decorate``, which casts the parameters): ``ampsafe run``'s report words its fix with them
    island_levels: dict
    # the run's scaler options as this framework's GradScaler spells them ({"min_scale": "min_loss_scaling", ...}):
    # ``ampsafe run`` passes its floor to the scaler under these names
    scaler_args: Mapping[str, str]

    def float32(self) -> ContextManager:
        """No autocast, no float16 emulation, no grad: what float32 really gives (a float32 replay or reference,
        an op's float32 re-run)."""

    def in_float32(self) -> bool:
        """Inside :meth:`float32` on this thread: code that would turn low precision on by itself stays off."""

    def check_level(self, level: str) -> str:
        """The level (``core.amp.LEVELS``) as this framework spells it, or a ConfigError naming the accepted ones."""

    def runs_low(self, op: str, kind, input_halves: list[bool], *, level: str, target: str) -> bool:
        """Whether the canonical ``op`` of ``kind`` (an :class:`~ampsafe.core.graph.OpKind`) computes in float16
        at ``level`` on ``target``, given whether each of its batched floating inputs would be float16."""

    # -- the precision a training step ran in, for its replay at the loss-scale floor
    def state(self) -> Any:
        """The precision a forward starting now runs in (the framework's autocast, ampsafe's float16 emulation):
        an opaque value the scalers' :class:`~ampsafe.core.capture.InputCapture` records at each captured
        forward, so the floor replays the batch as the step ran it. Cheap: read on every training forward."""

    def replay(self, state) -> ContextManager:
        """No grad, in the precision :meth:`state` recorded (None: as the code around it runs): the floor's
        sentinel replay sees the step's float16 ops."""

    def heal_options(self, state) -> dict:
        """The :class:`~ampsafe.healing.Healer` keyword arguments (``level``, ``target``) that scan the precision
        :meth:`state` recorded (None: the defaults)."""


class AmpBase:
    """The :class:`Amp` members that hold unless a framework says otherwise: ``core.amp``'s levels, spelled as
    they are, one island line for every level, and a GradScaler taking ampsafe's own argument names."""

    island_levels: dict = {}
    scaler_args: Mapping[str, str] = {"min_scale": "min_scale", "on_floor": "on_floor"}
    check_level = staticmethod(levels.check_level)


class Backend(Protocol):
    """What ampsafe needs to know about one framework. One instance per framework, stateless."""

    name: str  # "torch" | "paddle", as reports spell it
    module_type: type
    tensors: Tensors  # the tensor facts
    amp: Amp  # the AMP facts
    swaps: Swaps  # the module facts the patch policies read

    # -- structure
    def modules(self, model) -> dict[str, Any]:
        """Module path -> module, the root as ``""``, as ``named_modules()`` / ``named_sublayers()`` spell it: each
        module once, under the first path that reaches it (a module held twice is one module; the tracer names
        it so too). The one map of paths that scan, patch, heal and ``ampsafe run`` read (grammar:
        :mod:`ampsafe.core.modpath`)."""

    def children(self, module) -> list: ...

    def parameters(self, module) -> list: ...

    def optimizer_params(self, optimizer) -> list:
        """Every parameter the optimizer updates, across its groups."""

    def live_modules(self) -> list:
        """Every module of this framework alive in the process (``gc``): where to look when no model is known."""

    def owner_of(self, optimizer, candidates: Iterable | None = None):
        """The smallest module whose parameters cover ``optimizer``'s (see :func:`owner_of`), or None."""

    # -- state a forward may move
    def state_slots(self, model) -> list[tuple[dict, str, Any]]:
        """(holder dict, name, tensor) of every tensor :meth:`state_tensors` lists: the slots a forward may rebind
        or write, which :meth:`snapshot` puts back."""

    def state_tensors(self, model) -> list:
        """Buffers plus the normalization statistics the framework keeps elsewhere: the one rule of what a
        forward may change besides activations (Paddle's BatchNorm ``_mean``/``_variance`` are non-trainable
        parameters)."""

    def snapshot(self, model) -> Callable[[], None]:
        """Copy :meth:`state_tensors` now; the returned function puts them (and their slots) back. A replay takes
        it through :meth:`replay`; alone, it keeps a step's start for a skipped step to return to."""

    def replay(self, model, precision: Any = None) -> ContextManager:
        """Inside it, run ``model`` again (a scan, a heal's measurement, a fix line's trial); on exit the model's
        state (:meth:`snapshot`), its parameters' bindings and the random state (:meth:`rng_state`) are as on
        entry, so the training's next draws are the ones it would have made without the replay. ``precision``:
        None leaves precision and autograd as the caller has them (a scan sets its own); :data:`FLOAT32` is
        ``amp.float32()`` with the sharding's float32 parameters; anything else is a step's precision from
        ``amp.state()``, entered with ``amp.replay``."""

    def norm_stats(self, module) -> tuple[Any, Any] | None:
        """(mean, variance) of a normalization's running statistics, or None: the one rule of what they are."""

    def running_stats(self, model) -> Iterator[tuple[str, Any, Any, Any]]:
        """(path, module, mean, variance) of every normalization layer that keeps running statistics."""

    def reset_running_stats(self, mean, var) -> None:
        """Back to their initial values: mean 0, variance 1."""

    # -- processes
    def all_gather(self, obj) -> list:
        """``obj`` of every rank in rank order; ``[obj]`` outside a process group."""

    def world_size(self) -> int:
        """Processes of the job (1 outside a process group): a rank must not run a forward of its own where the
        others' collectives could meet it."""

    wrappers: Mapping[str, frozenset]
    """Attribute -> the class names of the framework's data-parallel wrappers that keep the user's model there
    (torch's DDP as ``.module``, Paddle's ``DataParallel`` as ``._layers``): what ``core.model.unwrap`` looks
    through. The adapter package states it in its ``__init__`` and registers it there
    (``core.model.register_wrappers``), so a model is unwrapped by any of the package's modules, before its
    Backend is built."""

    sharding: Sharding
    """The engine that shards ``model``'s parameters across ranks (FSDP2), as a heal and the report need it:
    :class:`Sharding` (no engine) where the framework has none."""

    def rng_state(self) -> Callable[[], None]:
        """Save every random state a forward may draw from (the framework's generators on each device it has
        initialized, and the host ones its models use); the returned function puts them back. A scan, and the
        watch guard's replay of a step, draw as the step did and leave the training's draws unchanged."""

    # -- hooks
    def forward_pre_hook(self, model, fn: Callable[[tuple, dict], None]):
        """Call ``fn(args, kwargs)`` before every forward of ``model``; returns a handle with ``remove()``."""

    def forward_hook(self, module, fn: Callable[[Any], None]):
        """Call ``fn(output)`` after every forward of ``module`` (the output is left as it is); returns a handle
        with ``remove()``. Held by the module while it lives: for hooks a measurement removes again."""

    def trace(self, model, example_inputs, *, level, target, loss_fn=None, loss_scale=None) -> Graph:
        """One recorded forward (and backward with ``loss_fn``) as a framework-neutral graph, state restored."""

    def trace_hooks(self, model, *, level: str, target: str):
        """The tracer's hooks for one trace of ``model`` at ``level`` on ``target``: a
        :class:`~ampsafe.core.record.TraceHooks` (the framework's op interception; the recording algorithm is
        core's, the tensor facts are :attr:`tensors`)."""

    def watch(self, model, **options):
        """The framework's ``ampsafe.watch`` context object."""

    # -- ampsafe run
    def install_run(self, options, ledger, site) -> None:
        """Put ``ampsafe run``'s hooks in place in this framework, called right after it is imported in the run's
        child: its GradScaler spellings -> ampsafe's scaler (``site.scaler_class``, floor from
        ``options.scaler_kwargs(amp.scaler_args)``), the FP32 guard on its optimizers (``site.step_guard``), ``--emulate-fp16``
        emulation, target checks of its detection libraries (``site.target_hook``). Every patch goes through
        ``ledger`` (an :class:`~ampsafe.core.ledger.AttrPatches`: ``set``, ``wrap``, ``on_restore``), which
        ``ampsafe.auto.uninstall`` undoes; ``site`` (a :class:`Site`) also prints and records the banner
        lines (``say``, ``note``, ``tell``) and runs code after a later import (``when_imported``)."""


class Sharding:
    """What a heal and the report must know of an engine that shards a model's parameters across ranks and casts
    them for compute (FSDP2's ``param_dtype``). This base is "no such engine": every model computes in the dtypes
    its parameters have, a rank may replay alone, and there is no engine-side fix line."""

    def float32_params(self, model) -> ContextManager:
        """Inside it, ``model``'s parameters take part in its forward as float32 where the engine would cast them
        to float16 for compute: with :meth:`Amp.float32`, what a float32 replay runs in."""
        return nullcontext()

    def forward_is_collective(self, model) -> bool:
        """Whether every forward of ``model`` runs collectives that all ranks must join (FSDP2's all-gathers): a
        replay that one rank runs alone, at its exit, would hang."""
        return False

    def fix(self, model, paths: list[str]) -> dict[str, tuple[str, str]]:
        """The engine's own fix that keeps the modules at ``paths`` in float32 for good: key -> (line, advice)
        (FSDP2: its ``fully_shard(..., mp_policy=...)`` lines), or {}."""
        return {}

    def low_inputs(self, model) -> list[str]:
        """The module paths (not the root) whose floating inputs the engine casts to float16/bfloat16 at each
        forward (FSDP2: ``fully_shard`` modules with a low ``param_dtype``): a value past 65504 that enters one from
        outside is stored in float16 there, past any FP32 island of a module."""
        return []

    def widen(self, model, layers: list[str]) -> list[str]:
        """Give the engine's units that own the modules at ``layers`` (those whose inputs it casts to float16, see
        :meth:`low_inputs`) float32 compute for the rest of the run, on this rank (every rank widens the same);
        returns the units widened, [] where the engine cannot (then a value stored in float16 between them stays
        past any island)."""
        return []


class Site(Protocol):
    """The run's framework-neutral pieces, as ``Backend.install_run(options, ledger, site)`` gets them: they live
    in the run (``ampsafe.run.site.RunSite``), which a backend package never imports."""

    def say(self, line: str) -> None:
        """A line for the banner (stderr) only."""

    def note(self, line: str) -> None:
        """A line for the summary's list of changes only (one per patched attribute)."""

    def tell(self, line: str) -> None:
        """A line for both."""

    def swap(self, ledger, owner, attr: str, value, label: str) -> None:
        """``owner.attr = value`` (in ``ledger``) where ``owner`` has that attribute, ``label`` noted."""

    def when_imported(self, name: str, callback: Callable) -> None:
        """``callback(module)`` right after module ``name`` is imported (now if it is)."""

    def scaler_class(self, base: type, backend, **how) -> type:
        """The class put in place of ``backend``'s GradScaler: ``base`` with the run's floor as defaults (named
        by ``backend.amp.scaler_args``), told ``scale``, ``guards``, ``steps``, ``map_device``, ``replaces``."""

    def shim(self, cls: type, replaces: type | None) -> type:
        """Another spelling of :meth:`scaler_class`'s class, answering ``isinstance`` for ``replaces``."""

    def track(self, scaler, framework: str) -> None:
        """Track a loss scale the run put in place without a scaler class (a DeepSpeed engine's) as one scaler:
        its steps reach the summary, the report and the headroom sampler."""

    def through_scaler(self) -> ContextManager:
        """Inside it, the FP32 guard lets optimizer steps through: a loss scale (a DeepSpeed engine's) already
        checked their gradients, as inside a scaler's ``step``."""

    def step_guard(self, backend, offenders: Callable) -> Any:
        """The FP32 guard of ``backend``'s optimizers (``ampsafe.run.guard.StepGuard``) with the run's options: it
        skips a step by ``backend.tensors.grads_finite``, as ``watch(guard=True)`` does; ``offenders(optimizer)``
        names the parameters whose gradients are not finite."""

    def target_hook(self, where: str, policy: str) -> Any:
        """A target check of one detection entry point (``ampsafe.run.target_hooks.TargetHook``), counted in the
        summary."""


class Package(NamedTuple):
    """The parts of one adapter package, as its Backend's ``_package()`` names them."""

    tensors: Tensors  # ``backend.tensors``
    amp: Amp  # ``backend.amp``
    swaps: type  # the Swaps class (``backend.swaps`` is its instance, built with the backend)
    trace: ModuleType  # the tracer module: ``trace(backend, model, ...)`` and ``trace_hooks(backend, model, ...)``
    watch: type  # the Watch class: ``Watch(model, backend=..., **options)``


# The spellings of a normalization's running statistics (mean, variance), as modules keep them in buffers or in
# parameters: torch's ``_NormBase`` and the frozen BN variants of torchvision and ppdet (``running_*``), Paddle's
# BatchNorm (``_mean`` / ``_variance``, non-trainable parameters).
NORM_STAT_NAMES = (("running_mean", "running_var"), ("_mean", "_variance"))


class BackendBase:
    """The :class:`Backend` members written once for every framework: those that follow from its other facts, and
    the hand-over to the rest of the adapter package.

    Subclasses live in ``ampsafe.<name>.backend`` and name their package's parts in ``_package()`` (a
    :class:`Package`: plain imports, on first use, so resolving a backend stays cheap). The Backend hands itself to
    them, so those modules never import ``backend.py``: the package's imports run one way."""

    module_type: type = object
    wrappers: Mapping[str, frozenset] = {}

    @property
    def name(self) -> str:
        """The framework's name: its adapter package's (``ampsafe.<name>.backend``), as the registry keys it."""
        return type(self).__module__.split(".")[1]

    def children(self, module) -> list:
        return list(module.children())

    def parameters(self, module) -> list:
        return list(module.parameters())

    sharding: Sharding = Sharding()  # stateless: one instance serves every backend without an engine

    def world_size(self) -> int:
        return 1  # a framework without processes

    def live_modules(self) -> list:
        return live_objects(self.module_type)

    def owner_of(self, optimizer, candidates: Iterable | None = None):
        return owner_of(self, optimizer, candidates)

    def running_stats(self, model) -> Iterator[tuple[str, Any, Any, Any]]:
        for path, module in self.modules(model).items():
            stats = self.norm_stats(module)
            if stats is not None:
                yield path, module, *stats

    def norm_stats(self, module) -> tuple[Any, Any] | None:
        held = {**(getattr(module, "_buffers", None) or {}), **(getattr(module, "_parameters", None) or {})}
        for mean_name, var_name in NORM_STAT_NAMES:
            mean, var = held.get(mean_name), held.get(var_name)
            if mean is not None and var is not None:
                return mean, var
        return None

    def reset_running_stats(self, mean, var) -> None:
        lib = self.tensors.lib
        self.tensors.assign([mean, var], [lib.zeros_like(mean), lib.ones_like(var)])

    def state_tensors(self, model) -> list:
        return [t for _, _, t in self.state_slots(model)]

    def snapshot(self, model) -> Callable[[], None]:
        slots = self.state_slots(model)
        with self.tensors.no_grad():
            copies = [self.tensors.lib.clone(t) for _, _, t in slots]

        def restore() -> None:
            for holder, name, t in slots:
                holder[name] = t
            self.tensors.assign([t for _, _, t in slots], copies)

        return restore

    @contextmanager
    def replay(self, model, precision: Any = None) -> Iterator[None]:
        restore_state, restore_rng = self.snapshot(model), self.rng_state()
        # Parameters are not copied: no forward writes them, and a copy of every weight at a heal would double
        # the model's memory just when a run is in trouble. Their bindings are put back and a write in place is
        # named; not where a sharding engine owns the slots (FSDP2 swaps sharded and gathered parameters itself).
        params = [] if self.sharding.forward_is_collective(model) else self._param_slots(model)
        versions = [self.tensors.version(p) for _, _, p in params]
        try:
            with ExitStack() as stack:
                if isinstance(precision, str):
                    if precision != FLOAT32:
                        raise ValueError(f"precision {precision!r}: {FLOAT32!r}, a state from amp.state(), or None")
                    stack.enter_context(self.amp.float32())
                    stack.enter_context(self.sharding.float32_params(model))
                elif precision is not None:
                    stack.enter_context(self.amp.replay(precision))
                yield
        finally:
            for holder, name, p in params:
                holder[name] = p
            restore_state()
            restore_rng()
            written = [n for (_, n, p), v in zip(params, versions) if self.tensors.version(p) != v]
            if written:
                log.warning(
                    "ampsafe: a replay wrote parameters in place (%s); they keep its values", ", ".join(written)
                )

    def _param_slots(self, model) -> list[tuple[dict, str, Any]]:
        """(holder dict, name, parameter) of every parameter of ``model``'s modules."""
        return [
            (holder, name, p)
            for module in self.modules(model).values()
            for holder in [getattr(module, "_parameters", None) or {}]
            for name, p in list(holder.items())
            if p is not None
        ]

    def _package(self) -> Package:
        """The parts of the adapter package."""
        raise NotImplementedError

    @cached_property
    def _parts(self) -> Package:
        return self._package()

    @property
    def tensors(self) -> Tensors:
        return self._parts.tensors

    @property
    def amp(self) -> Amp:
        return self._parts.amp

    def trace(self, model, example_inputs, **options) -> Graph:
        return self._parts.trace.trace(self, model, example_inputs, **options)

    def trace_hooks(self, model, *, level: str, target: str):
        return self._parts.trace.trace_hooks(self, model, level=level, target=target)

    def watch(self, model, **options):
        return self._parts.watch(model, backend=self, **options)

    @cached_property
    def swaps(self) -> Swaps:
        return self._parts.swaps(self)

    # ``ampsafe run``'s hooks: the package's ``run.install``. That module stands above the package's scaler, which
    # holds this Backend, so the registry (``ampsafe._framework``) hands it in rather than this class importing it.
    _run_install: Callable | None = None

    def with_run(self, install: Callable) -> BackendBase:
        """This Backend, its :meth:`install_run` being ``install(options, ledger, site)``."""
        self._run_install = install
        return self

    def install_run(self, options, ledger, site) -> None:
        if self._run_install is None:
            raise RuntimeError(f"{type(self).__name__} has no ampsafe run hooks: resolve it through ampsafe._framework")
        self._run_install(options, ledger, site)


def owner_of(backend: Backend, optimizer, candidates: Iterable | None = None):
    """The smallest module whose parameters include every parameter of ``optimizer``; None if none does.

    ``candidates``: root models to search (their submodules count); without them every live module of the
    framework is searched (``gc``). From the covering root with the fewest parameters it descends while a
    child still covers them all, so a wrapper (DDP, a ``Sequential`` holding the model and a loss) gives way
    to the model it wraps, and an optimizer over a head alone resolves to the head.
    """
    wanted = {id(p) for p in backend.optimizer_params(optimizer)}
    if not wanted:
        return None
    roots = list(candidates) if candidates is not None else live_roots(backend)

    def covers(module) -> bool:
        return wanted <= {id(p) for p in backend.parameters(module)}

    covering = [m for m in roots if covers(m)]
    if not covering:
        return None
    best = min(covering, key=lambda m: len(backend.parameters(m)))
    while True:
        child = next((c for c in backend.children(best) if covers(c)), None)
        if child is None:
            return best
        best = child


def live_roots(backend: Backend) -> list:
    """The live modules of the backend's framework that are no other live module's child."""
    modules = backend.live_modules()
    inner = {id(c) for m in modules for c in backend.children(m)}
    return [m for m in modules if id(m) not in inner]
