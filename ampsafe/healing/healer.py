"""The healer a scaler calls at the loss-scale floor: look at the last batch, decide, island what overflows.

Why a class of its own: it holds the only state of a heal (the last inputs, the heals so far) and makes every
decision collectively (verdicts all-gathered through the model's Backend), so all ranks raise the same error
or island the same union of paths. It decides on one :class:`~ampsafe.core.verdict.HealVerdict`: the floor's
measured verdict (the scaler's replay under the sentinel, :mod:`ampsafe.healing.floor_replay`) completed by one scan
of the batch (paths, ops, float32 finiteness and magnitude: :class:`~ampsafe.healing.evidence.ScanProbe`).
A heal runs the model at most twice (the sentinel's replay and the scan), plus one backward when the verdict
says the backward overflowed and a ``loss_fn`` lets the scan measure it (the scan runs in float32, Paddle's
float16 emulation paused); a third, float32 run only when the scan saw a non-finite value (a numerical error, or
a scan that ran inside the framework's own AMP).

What is islanded: the risky paths the scan found, whole (each unnormalized conv/matmul chain up to the
normalization that ends it), and the modules running risky ops. One exception: when the heal rule saw a
module's float16 ``inf`` swallowed by the next ops (:attr:`FloorInfo.swallowed`) and every path found peaks in
that module, that module alone: the paths are in range up to it (PP-OCRv4's four RSE neck paths and its head
conv all peak in ``head.binarize.conv1``: 1 module, not 15).
"""

from __future__ import annotations

import logging
import math
import weakref
from dataclasses import replace
from typing import Any, Callable, Optional

from ..core.capture import InputCapture, example_inputs
from ..core.graph import FP16_MAX
from ..core.model import unwrap
from ..core.modpath import under
from ..core.scale import HealPlan, HealRecord
from ..core.scan_report import RiskOp, RiskPath
from ..core.swaps import protection_of
from ..core.verdict import HealVerdict
from ..errors import ConfigError, LossScaleFloorError
from .evidence import ScanProbe, float32_replay, nonfinite_sample, repair_running_stats, restore_scale
from .floor_replay import anywhere, not_replayed
from .fronts import fronts

__all__ = ["Healer"]

log = logging.getLogger("ampsafe.heal")


def _weak(obj) -> Callable[[], Any]:
    try:
        return weakref.ref(obj)
    except TypeError:  # an object that takes no weak reference: held as it is
        return lambda: obj


class Healer:
    """A scaler's ``heal_hook``: remembers the model's last inputs and islands what overflows on them.

    ``margin_bits``: a path is healed when its float32 abs-max comes within this many bits of 65504 on the
    replayed batch (1 bit: above 32752), so it does not overflow again on the next, slightly larger batch.
    ``max_heals``: give up with :class:`LossScaleFloorError` after that many heals. ``loss_fn(output)``:
    optional; lets the float32 check look at the loss and the search find paths whose *gradients* overflow.
    ``backend``: the model's :class:`~ampsafe.core.backend.Backend`, which the caller holds (a scaler, the
    ``ampsafe.heal`` front). ``capture``: an :class:`~ampsafe.core.capture.InputCapture` of ``model`` to replay from (a scaler lends
    its own); without it the healer captures the inputs itself. ``scan`` / ``patch``: what finds the paths
    and islands them (``ampsafe.scan`` / ``ampsafe.patch`` unless given: :mod:`ampsafe.healing.fronts`).

    Every check is collective: each rank replays its own last batch, the verdicts are all-gathered, and every
    rank raises the same error or patches the same union of paths, so the replicas stay identical.
    """

    def __init__(
        self,
        model,
        *,
        backend,
        level: str = "O1",
        target: str = "cuda",
        margin_bits: float = 1.0,
        max_heals: int = 3,
        loss_fn: Optional[Callable] = None,
        capture: Optional[InputCapture] = None,
        scan: Optional[Callable] = None,
        patch: Optional[Callable] = None,
    ):
        if not isinstance(max_heals, int) or max_heals < 0:
            raise ConfigError(f"max_heals must be an int >= 0, got {max_heals!r}")
        if loss_fn is not None and not callable(loss_fn):
            raise ConfigError("loss_fn must be callable: loss_fn(output) -> scalar tensor")
        model = unwrap(model)
        self._model = _weak(model)  # the script holds its model; a healer kept in a scaler must not keep it alive
        self.backend = backend
        self.framework = self.backend.name
        self.level, self.target, self.margin_bits = level, target, margin_bits
        self.max_heals, self.loss_fn = max_heals, loss_fn
        self.heals: list[HealRecord] = []
        self._given: Any = None  # inputs set by hand (``heal(model, batch_fn)``), else the capture's
        self._own_capture = capture is None
        self.capture = InputCapture(self.backend, self.model) if capture is None else capture
        self._scan, self._patch = scan, patch

    @property
    def model(self):
        """The healed model, held weakly (None once the script dropped it)."""
        return self._model()

    @property
    def last_inputs(self) -> Any:
        """The batch a heal replays: set by hand, or the inputs of the model's latest forward
        (:func:`~ampsafe.core.capture.example_inputs`); None when there is none, or none that can be named."""
        if self._given is not None:
            return self._given
        latest, model = self.capture.latest, self.model
        if latest is None or model is None:
            return None
        try:
            return example_inputs(model, latest)
        except ValueError:
            log.info("ampsafe heal: the latest forward's inputs cannot be named as one batch", exc_info=True)
            return None

    @last_inputs.setter
    def last_inputs(self, inputs: Any) -> None:
        self._given = inputs

    def detach(self) -> None:
        """Stop remembering inputs (the hook is removed; a capture the scaler lent stays with the scaler)."""
        if self._own_capture:
            self.capture.remove()

    @property
    def scan(self) -> Callable:
        return self._scan if self._scan is not None else fronts().scan

    @property
    def patch(self) -> Callable:
        return self._patch if self._patch is not None else fronts().patch

    def find(self, inputs, loss_scale: Optional[float] = None) -> list[RiskPath]:
        """The unprotected paths that overflow (or come within ``margin_bits`` of it) on ``inputs``.

        With ``loss_fn`` and nothing near the edge in the forward, the backward at ``loss_scale`` is searched too.
        """
        return list(self._search(inputs, HealVerdict("scanned"), loss_scale).paths)

    def _search(self, inputs, verdict: HealVerdict, loss_scale: Optional[float], off_floor: bool = False):
        """``verdict`` with what one scan of ``inputs`` found: the unprotected risky paths and the unprotected risky
        non-conv/matmul ops (Paddle O2 runs DBHead's step-function ``exp`` in float16: no conv/matmul path
        overflows there, the ``exp`` does), whether float32 is finite, the forward module's float32 magnitude.

        One scan: with the backward (``loss_fn`` at ``loss_scale``) when the measured verdict is not a forward
        overflow, else the forward alone. A batch nobody replayed (a heal off the floor, or on a given batch)
        gets the backward scan only when the forward has nothing near the edge (never off the floor, which
        heals forward overflows only).
        """
        backward = self.loss_fn is not None and bool(loss_scale)
        measured = verdict.where not in ("scanned", "not replayed")
        # (a scan's backward runs the engine's collectives too: where the forward is collective, all ranks or none)
        both = self._anywhere(backward and measured and verdict.where != "forward")
        module = verdict.module if verdict.where == "forward" and verdict.amax_fp32 is None else None
        report, probe = self._scanned(inputs, loss_scale if both else None, module)
        open_or_new = [p for p in report.paths if p.risky and (not p.protected or self._open_layers(p))]
        ops = [o for o in report.risky_ops if not o.protected_by]
        bad, magnitude = probe.nonfinite(self.loss_fn), probe.magnitude
        if self._anywhere(bad is not None or (magnitude is not None and not math.isfinite(magnitude))):
            # non-finite in the scan: float32 decides (a scan inside the framework's own AMP is not float32)
            bad, magnitude = float32_replay(self.backend, self.model, inputs, self.loss_fn, module)
        again = not open_or_new and not ops and not bad and backward and not measured and not off_floor
        if self._anywhere(again):
            report, _ = self._scanned(inputs, loss_scale, None)
            if again:
                open_or_new = [p for p in report.paths if p.overflows_in and not p.protected]
        found = replace(verdict, paths=tuple(open_or_new), ops=tuple(ops), float32_nonfinite=bad)
        if module is not None and magnitude is not None:
            found = replace(found, amax_fp32=magnitude)
        return found

    def _scanned(self, inputs, loss_scale: Optional[float], module: Optional[str]):
        """(scan report, probe) of one scan of ``inputs``, with the backward at ``loss_scale`` if given."""
        probe = ScanProbe(self.backend, self.model, module)
        loss = {"loss_fn": probe.wrap(self.loss_fn), "loss_scale": loss_scale} if loss_scale else {}
        try:
            with self.backend.sharding.float32_params(self.model):
                report = self.scan(
                    self.model, inputs, level=self.level, target=self.target, margin_bits=self.margin_bits, **loss
                )
        finally:
            probe.remove()
        return report, probe

    def _open_layers(self, path: RiskPath) -> list[str]:
        """The layers of an islanded path that still run in float16: an island's float32 output that grew past
        65504 overflows again where a float16 consumer casts it, so those consumers join the island."""
        islands = [m for m, module in self.backend.modules(self.model).items() if protection_of(module) == "island"]
        return [layer for layer in path.layers if not any(under(layer, q) for q in islands)]

    def _same_batch(self, scaler) -> bool:
        """Whether the scaler's measured verdict is about this healer's model and batch (the same tensors)."""
        if self._given is not None or getattr(scaler, "model", None) is not self.model:
            return False
        theirs, mine = getattr(getattr(scaler, "capture", None), "latest", None), self.capture.latest
        if theirs is None or mine is None:
            return False
        (a1, k1), (a2, k2) = theirs, mine
        return (
            len(a1) == len(a2)
            and all(x is y for x, y in zip(a1, a2))
            and k1.keys() == k2.keys()
            and all(k1[k] is k2[k] for k in k1)
        )

    def _local_verdict(self, measured: Optional[HealVerdict], loss_scale: Optional[float], off_floor: bool):
        """This rank's :class:`HealVerdict` of its last batch: the measured one (its data already checked) or a
        data check, completed by the scan."""
        inputs, done = self.last_inputs, None
        if inputs is None:
            done = not_replayed("the model has not run a forward since the healer was attached")
        elif measured is None or not measured.replayed:
            bad = nonfinite_sample(inputs, self.backend)
            if bad is not None:
                done = HealVerdict("data", input=bad[0], sample=bad[1])
            measured = HealVerdict("scanned")
        elif measured.where == "data":
            done = measured
        if self._anywhere(done is not None):  # a rank that does not scan: none scans (a collective forward)
            return done if done is not None else measured
        return self._search(inputs, measured, loss_scale, off_floor)

    def _anywhere(self, flag: bool) -> bool:
        return anywhere(self.backend, self.model, flag)

    def _widen(self, step: int, found: HealVerdict, history) -> Optional[HealPlan]:
        """A value past 65504 passes between the engine's units (FSDP2 sharded per layer), which cast their inputs
        to float16: the units every such path passes through get float32 compute for the rest of the run
        (:meth:`~ampsafe.core.backend.Sharding.widen`; ``found`` is every rank's, so every rank widens the same), and
        the path's modules outside them become FP32 islands (a norm after the stream goes back to float16 there).
        None when the engine widens nothing."""
        streams = _streams(found.paths)
        layers = list(dict.fromkeys(m for p in streams for m in (p.start, *p.layers)))
        widened = tuple(self.backend.sharding.widen(self.model, layers))
        if not widened:
            return None
        rest = [m for m in layers if m and not any(under(m, u) for u in widened)]
        result = self.patch(self.model, policy="island", level=self.level, paths=rest) if rest else None
        islanded = tuple(result.patched) if result is not None else ()
        reset = repair_running_stats(self.backend, self.model)
        restored = restore_scale(history)
        record = HealRecord(
            step=step,
            paths=widened + tuple(m for m in islanded if m not in widened),
            found=tuple(p.start for p in streams),
            amax={p.start: p.amax for p in streams},
            reset_running_stats=tuple(reset),
            verdict=found,
            widened=widened,
        )
        self.heals.append(record)
        log.warning(
            "ampsafe heal at step %s: a value past 65504 (max amax %s) passes between %s, whose inputs the engine "
            "casts to float16: gave %s float32 compute for the rest of the run%s; scale restored to %s",
            step,
            _fmt_max(record.amax),
            ", ".join(widened),
            "them" if len(widened) > 1 else "it",
            f", islanded {', '.join(islanded)}" if islanded else "",
            restored,
        )
        return HealPlan(record.paths, restored, record)

    def __call__(self, scaler=None, info=None, *, off_floor: bool = False) -> Optional[HealPlan]:
        """Heal on the last batch (the scaler's hook). ``off_floor=True`` (a streak of overflows above the floor):
        heal only when the scanned forward pass overflows, else return ``None`` (also when no heals are left),
        so the scaler goes on backing off: a backward-only overflow is what loss scaling is for."""
        step = getattr(info, "step", len(self.heals))
        history = getattr(info, "scale_history", ())
        err = {"offenders": getattr(info, "offenders", ()), "scale_history": history}
        if off_floor and len(self.heals) >= self.max_heals:
            return None
        if len(self.heals) >= self.max_heals:
            raise LossScaleFloorError(
                f"gave up after {len(self.heals)} heals (max_heals={self.max_heals}); the overflow persists. Healed "
                f"so far: {[list(h.found) for h in self.heals]}. See ampsafe.scan(model, inputs).to_markdown().",
                **err,
            )
        floor = float(history[-1]) if history else None
        measured = getattr(info, "verdict", None)
        measured = measured if measured is not None and self._same_batch(scaler) else None
        with self.capture.paused():  # the scan below is not the step's forward
            local = self._local_verdict(measured, floor, off_floor)
        verdicts = self.backend.all_gather(local)  # every rank decides alike
        many = len(verdicts) > 1
        where = (lambda r: f"rank {r}: ") if many else (lambda r: "")

        def fail(message: str) -> LossScaleFloorError:
            exc = LossScaleFloorError(message, **err)
            if measured is not None:  # the floor error says what this rank's scan added to the measured verdict
                exc.verdict = local
            return exc

        if all(not v.replayed for v in verdicts):
            raise fail(
                "ampsafe.heal has no batch to replay: the model has not run a forward since the healer was attached"
            )
        for rank, v in enumerate(verdicts):
            if v.where == "data":
                raise fail(
                    f"not healed: the overflow is not in the model: {where(rank)}input {v.input} of the batch of "
                    f"step {step} is non-finite at sample {v.sample}. Fix the data (ampsafe.check_targets / "
                    "ampsafe.watch name such samples)."
                )
        for rank, v in enumerate(verdicts):
            if v.float32_nonfinite:
                raise fail(
                    f"not healed: {where(rank)}{v.float32_nonfinite} is non-finite in float32 too on the replayed "
                    "batch: a numerical error (log/sqrt/division of a bad value, a diverging learning rate), not a "
                    "float16 range problem, so FP32 islands would not fix it. Run the step under "
                    "ampsafe.watch(model) to name the op."
                )
        found = _merged(local, verdicts)
        stored = _stored_low(found.paths, self.backend.sharding.low_inputs(self.model))
        if stored is not None:
            plan = self._widen(step, found, history)
            if plan is not None:
                return plan
            path, entered = stored
            raise fail(
                f"not healed: the path from {path.start} reaches |x| = {path.amax:.4g} in float32 on the replayed "
                f"batch and enters {entered}, whose inputs the engine casts to float16 (FSDP2's param_dtype): the "
                "value is stored in float16 between modules (a residual stream), where no FP32 island of a module "
                "can hold it. Keep that stream out of float16 (under torch.autocast with float32 parameters the "
                "stream between layers is float32; bfloat16 holds it), or keep it smaller (a lower learning rate, "
                "weight decay)."
            )
        names = sorted(p.start for p in found.paths)
        by_op = {f"{o.module}:{o.op}": o for o in found.ops}
        op_keys = sorted(by_op)
        if off_floor and not found.forward_overflow:
            # near the edge is not over it: this streak is a backward overflow, which a smaller scale fixes
            log.info("ampsafe heal at step %s: the forward pass is in range; the scaler backs off", step)
            return None
        if not names and not op_keys:
            raise fail(
                "not healed: the replayed batch is finite in float32 and nothing in the model comes within "
                f"{self.margin_bits:g} bits of float16's max on it (on any rank); the non-finite values come from "
                "elsewhere (the loss, a custom op, the optimizer). Run the step under ampsafe.watch(model) to name "
                "the op."
            )
        # a risky op is islanded with the module whose forward runs it (the smallest one the trace names)
        op_modules = [m for m in dict.fromkeys(by_op[k].module for k in op_keys) if m not in names]
        if any(m != "" for m in names + op_modules):
            # what the root's own forward computes (a loss inside the model, as ultralytics' DetectionModel) reads
            # the submodules' outputs: islanding those is the fix, islanding the root is no AMP at all
            names = [n for n in names if n != ""]
            op_modules = [m for m in op_modules if m != ""]
            op_keys = [k for k in op_keys if by_op[k].module != ""]
        elif "" in names + op_modules:
            root_ops = [k for k in op_keys if by_op[k].module == ""] or [p.start_op for p in found.paths]
            raise fail(
                f"not healed: {', '.join(root_ops)} overflows float16 in the model's own forward (no submodule "
                "runs it), and an FP32 island of the whole model is no AMP at all. Move the op into a submodule, "
                "or keep it in float32 (Paddle: auto_cast(custom_black_list=[...]))"
            )
        by_start = {p.start: p for p in found.paths}
        peak = _common_peak(found.paths, getattr(info, "swallowed", None))
        targets = ([peak] if peak else [by_start[n] for n in names]) + op_modules
        result = self.patch(self.model, policy="island", level=self.level, paths=targets)
        reset = repair_running_stats(self.backend, self.model)
        restored = restore_scale(history)
        amax = {n: by_start[n].amax for n in names}
        amax.update({k: by_op[k].amax for k in op_keys})
        islanded = tuple(result.patched) or tuple(names + op_modules)
        record = HealRecord(
            step=step,
            paths=islanded,
            found=tuple(names + op_modules),
            ops=tuple(op_keys),
            amax=amax,
            reset_running_stats=tuple(reset),
            verdict=found,
        )
        self.heals.append(record)
        risky: dict[str, list[str]] = {}
        for k in op_keys:
            risky.setdefault(by_op[k].module, []).append(by_op[k].op)
        listed = names + [f"{m} (risky {', '.join(ops)})" for m, ops in risky.items() if m not in names]
        # the modules named here are the ones the scaler records, report.json keeps and the report's patch line
        # gives: one list, so the permanent fix is the heal that was logged
        log.warning(
            "ampsafe heal at step %s: islanded %d module(s) (%s) for %s, max amax %s; scale restored to %s%s",
            step,
            len(islanded),
            ", ".join(islanded),
            f"the path(s) starting at {', '.join(listed)}",
            _fmt_max(amax),
            restored,
            f"; reset non-finite running statistics of {', '.join(reset)}" if reset else "",
        )
        return HealPlan(islanded, restored, record)


def _streams(paths) -> list[RiskPath]:
    """The paths whose float32 value passes float16's max in the forward (finite in float32)."""
    return [p for p in paths if p.overflows_in == "forward" and FP16_MAX < _amax(p) < math.inf]


def _common_peak(paths, swallowed: Optional[str]) -> Optional[str]:
    """``swallowed`` when every path found peaks in it (its output holds each path's amax): then the paths only
    carry values to the one module that overflows, in float16's range up to it, and that module alone is the
    island (its float32 output goes on to the normalization or consumer after it, which join the island on a
    later heal only if they overflow). None otherwise: the paths are islanded whole."""
    if not swallowed or not paths:
        return None
    peaks = {(p.peak.rpartition(":")[0] if p.peak else p.start) for p in paths}
    return swallowed if peaks == {swallowed} else None


def _merged(local: HealVerdict, verdicts: list) -> HealVerdict:
    """``local`` with the paths and ops of every rank: per path start (per ``module:op``) the largest amax."""
    by_start: dict[str, RiskPath] = {}
    by_op: dict[str, RiskOp] = {}
    for v in verdicts:
        for path in v.paths:
            old = by_start.get(path.start)
            if old is None or _amax(path) > _amax(old):
                by_start[path.start] = path
        for op in v.ops:
            key = f"{op.module}:{op.op}"
            old = by_op.get(key)
            if old is None or _amax(op) > _amax(old):
                by_op[key] = op
    return replace(local, paths=tuple(by_start.values()), ops=tuple(by_op.values()))


def _stored_low(paths, low_inputs: list[str]) -> Optional[tuple[RiskPath, str]]:
    """(a path whose float32 value passes float16's max in the forward, the module it enters from outside whose
    inputs the engine casts to float16), or None: that value is float16 between the modules, past any island."""
    for path in paths:
        if path.overflows_in != "forward" or not FP16_MAX < _amax(path) < math.inf:
            continue
        for layer in path.layers:
            entered = next((m for m in low_inputs if under(layer, m) and not under(path.start, m)), None)
            if entered is not None:
                return path, entered
    return None


def _amax(found: RiskPath | RiskOp) -> float:
    return -1.0 if found.amax is None or math.isnan(found.amax) else float(found.amax)


def _fmt_max(amax: dict) -> str:
    vals = [v for v in amax.values() if v is not None]
    if not vals:
        return "-"
    m = max(vals)
    return "inf" if math.isinf(m) else f"{m:.3g}"
