"""The headroom monitor of ``ampsafe.watch(monitor_every=N)``: abs-max of the unnormalized paths, every N passes.

Why apart: it is the one part of the watcher that needs the scan (which paths to measure), and that is passed
in (``WatchBase.scan``), so core never imports the front-end ``ampsafe.scanner``. Pure Python.
"""

from __future__ import annotations

from .capture import example_inputs
from .sentinel import HeadroomWarning, headroom_warnings, log

__all__ = ["Monitor"]


class Monitor:
    """Mixin of :class:`~ampsafe.core.watcher.WatchBase`: paths from ``self.scan``, forward hooks
    (``backend.forward_hook``) on their layers on monitored steps, one host sync per monitored step, warnings below
    ``margin_bits``."""

    def emit_headroom(self, path_amax: dict, step: int) -> list[HeadroomWarning]:
        found = headroom_warnings(path_amax, margin_bits=self.margin_bits, step=step, already=self._warned)
        for w in found:
            self.warnings.append(w)
            log.warning("%s", w.message)
            if self.callback is not None:
                self.callback(w)
        return found

    def monitored(self, step: int) -> bool:
        """Whether forward number ``step`` (0-based) is a monitored step (0, N, 2N, ...)."""
        return self.monitor_every is not None and step % self.monitor_every == 0

    def _find_paths(self, args, kwargs) -> list[tuple[str, tuple]]:
        """Unnormalized paths (start, layers) from ``ampsafe.scan`` on this step's inputs (state restored)."""
        if self.scan is None:
            log.warning("ampsafe.watch: no scan function given; monitoring every conv/linear output")
            return self._fallback_paths()
        self._suspended += 1
        try:
            with self.backend.replay(self.model):
                report = self.scan(self.model, example_inputs(self.model, (args, kwargs)), margin_bits=self.margin_bits)
            paths = [(p.start, tuple(p.layers)) for p in report.paths if not p.normalized]
        except Exception as exc:  # noqa: BLE001 - no scan: watch every conv/linear output instead
            log.warning("ampsafe.watch: scan unavailable (%s); monitoring every conv/linear output", exc)
            paths = self._fallback_paths()
        finally:
            self._suspended -= 1
        return paths

    def _monitor_begin(self, args, kwargs, step: int) -> None:
        if self._paths is None:
            self._paths = self._find_paths(args, kwargs)
        layers = self.backend.modules(self.model)
        wanted = {x for _, path in self._paths for x in path if x in layers}
        self._monitor_amax = {}
        self._monitor_step = step
        for name in wanted:
            self._monitor_handles.append(self.backend.forward_hook(layers[name], self._amax_hook(name)))

    def _amax_hook(self, name: str):
        def hook(outputs) -> None:
            floats = self._float_tensors(outputs)
            if not floats or self._suspended:
                return
            ts = self.tensors
            self._suspended += 1
            try:
                with ts.no_grad():
                    prev = self._monitor_amax.get(name)
                    for t in floats:
                        amax = ts.abs_max(t)
                        prev = amax if prev is None else ts.maximum(prev, amax)
                    self._monitor_amax[name] = prev
            finally:
                self._suspended -= 1

        return hook

    def _monitor_detach(self) -> None:
        for h in self._monitor_handles:
            h.remove()
        self._monitor_handles = []

    def _monitor_end(self) -> None:
        if self._monitor_step is None:
            return
        step, self._monitor_step = self._monitor_step, None
        self._monitor_detach()
        if not self._monitor_amax:
            return
        names = list(self._monitor_amax)
        amax = dict(zip(names, self.tensors.to_floats([self._monitor_amax[n] for n in names])))  # one host sync
        path_amax = {}
        for start, layers in self._paths or []:
            seen = [amax[x] for x in layers if x in amax]
            if seen:
                path_amax[start] = (layers, max(seen))
        self.emit_headroom(path_amax, step)
