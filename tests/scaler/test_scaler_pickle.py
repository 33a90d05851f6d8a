"""A pickled GradScaler (torch and Paddle) carries its state, not the model, callbacks or hooks around it."""

from __future__ import annotations

import copy
import functools
import io
import math
import pickle
import sys

import numpy as np
import pytest
from scaler_helpers import paddle_fp16_amp_state, paddle_model, poison_paddle_grad, poison_torch_grad, torch_model

import ampsafe

PATTERN = [False, True, False, False, True, True, False, False, False, True, False, False]  # never 3 overflows in a row
KW = dict(growth_interval=2, hysteresis=2)


class _Recorder(pickle.Pickler):
    """A pickler that notes every object it is asked to pickle (the few basic types it isn't asked about are
    numbers, strings and containers: no model or hook hides in those)."""

    def __init__(self):
        super().__init__(io.BytesIO())
        self.seen: list = []

    def reducer_override(self, obj):
        self.seen.append(obj)
        return NotImplemented


class _Torch:
    name = "torch"

    def __init__(self):
        import torch

        self.torch = torch
        self.x = torch.randn(16, 4, generator=torch.Generator().manual_seed(1))

    def model(self, seed=0):
        return torch_model(seed)

    def scaler(self, **kw):
        return ampsafe.torch.GradScaler("cpu", init_scale=2.0**8, min_scale=1.0, on_floor="heal", **KW, **kw)

    def copy_model(self, src, dst):
        dst.load_state_dict(src.state_dict())

    def train(self, scaler, model, pattern):
        opt = self.torch.optim.SGD(model.parameters(), lr=0.05)  # stateless: two copies continue identically
        scales = []
        for bad in pattern:
            opt.zero_grad()
            scaler.scale(model(self.x).pow(2).mean()).backward()
            if bad:
                poison_torch_grad(model[2].weight)
            scaler.step(opt)
            scaler.update()
            scales.append(scaler.get_scale())
        return scales, [p.detach().numpy().copy() for p in model.parameters()]

    def is_model_object(self, obj) -> bool:
        return isinstance(obj, (self.torch.nn.Module, self.torch.Tensor))


class _Paddle:
    name = "paddle"

    def __init__(self):
        import paddle

        self.paddle = paddle
        self.x = np.random.default_rng(1).standard_normal((16, 4)).astype("float32")

    def model(self, seed=0):
        return paddle_model(seed)

    def scaler(self, **kw):
        return ampsafe.paddle.GradScaler(
            init_loss_scaling=2.0**8,
            incr_every_n_steps=KW["growth_interval"],
            decr_every_n_nan_or_inf=KW["hysteresis"],
            min_loss_scaling=1.0,
            on_floor="heal",
            emulated=True,  # a CPU: scale as on a GPU (the AMP state is float16, as after auto_cast there)
            **kw,
        )

    def copy_model(self, src, dst):
        dst.set_state_dict(src.state_dict())

    def train(self, scaler, model, pattern):
        paddle = self.paddle
        opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
        scales = []
        with paddle_fp16_amp_state():
            for bad in pattern:
                scaler.scale(model(paddle.to_tensor(self.x)).pow(2).mean()).backward()
                if bad:
                    poison_paddle_grad(model[2].weight)
                scaler.step(opt)
                scaler.update()
                opt.clear_grad()
                scales.append(scaler.get_loss_scaling())
        return scales, [p.numpy().copy() for p in model.parameters()]

    def is_model_object(self, obj) -> bool:
        return isinstance(obj, (self.paddle.nn.Layer, self.paddle.Tensor))


def _local_callable(obj) -> bool:
    """A callable that is not an importable global (a lambda, a closure, a bound method, a hook object): what a
    pickle of state alone never holds (module-level functions such as a defaultdict's factory are names)."""
    if not callable(obj) or isinstance(obj, type):
        return False
    module, name = sys.modules.get(getattr(obj, "__module__", None) or ""), getattr(obj, "__qualname__", "")
    return functools.reduce(lambda o, part: getattr(o, part, None), name.split("."), module) is not obj


@pytest.fixture(params=["torch", "paddle"])
def fw(request):
    return _Torch() if request.param == "torch" else _Paddle()


def _hooked(fw, model):
    """A scaler with everything a training loop hangs on it: ``model=``, a callback closing over the model, a
    heal hook (``ampsafe.heal`` keeps the model and its last inputs) and the patience ``ampsafe.heal`` attaches."""
    records = []
    scaler = fw.scaler(model=model, callback=lambda d: records.append((d, model)))  # a lambda: can't pickle
    healer = ampsafe.heal(model, scaler=scaler, patience=3)
    return scaler, healer, records


def test_pickle_carries_state_not_the_model_callbacks_or_hooks(fw):
    model = fw.model()
    scaler, healer, records = _hooked(fw, model)
    fw.train(scaler, model, PATTERN)
    assert records and scaler.heal_hook is healer and scaler._attached_patience == 3

    recorder = _Recorder()
    recorder.dump(scaler)
    leaked = [type(o).__name__ for o in recorder.seen if fw.is_model_object(o) or _local_callable(o)]
    assert not leaked, f"the pickle holds {leaked}"
    assert all(o is not healer and o is not records for o in recorder.seen)

    clone = pickle.loads(pickle.dumps(scaler))
    assert clone.state_dict().keys() == scaler.state_dict().keys()
    for key, value in scaler.state_dict().items():
        assert np.array_equal(clone.state_dict()[key], value) if key == "scale" else clone.state_dict()[key] == value
    assert clone.stats.to_dict() == scaler.stats.to_dict()
    assert clone.heal_hook is None and clone._model is None and clone._core.callbacks == []
    assert clone._attached_patience is None  # as the heal hook: ampsafe.heal(patience=) must be re-attached
    # the original keeps all of it
    assert scaler.heal_hook is healer and scaler._model is model and len(scaler._core.callbacks) == 1
    healer.detach()


def test_an_unpickled_scaler_continues_exactly_as_the_original(fw):
    model = fw.model()
    scaler = fw.scaler(model=model, callback=lambda d: None)
    fw.train(scaler, model, PATTERN)
    clone, model2 = pickle.loads(pickle.dumps(scaler)), fw.model(seed=5)
    fw.copy_model(model, model2)
    rest = [True, False, False, False, True, False, False]
    assert fw.train(clone, model2, rest)[0] == fw.train(scaler, model, rest)[0]
    assert clone.stats.to_dict() == scaler.stats.to_dict()
    assert all(
        np.array_equal(a, b) for a, b in zip(fw.train(clone, model2, [False])[1], fw.train(scaler, model, [False])[1])
    )


def test_hooks_reattached_after_unpickling_work_again(fw):
    model = fw.model()
    scaler, healer, _ = _hooked(fw, model)
    fw.train(scaler, model, PATTERN[:4])
    healer.detach()
    clone = copy.deepcopy(scaler)  # deepcopy goes through the same state: no hooks either
    assert clone.heal_hook is None and clone._core.callbacks == []
    records = []
    clone.add_step_callback(records.append)
    again = ampsafe.heal(model, scaler=clone)
    assert clone.heal_hook is again
    fw.train(clone, model, [True, False])
    assert [r.skipped for r in records] == [True, False]
    assert clone.stats.total_steps == 6 and math.isfinite(records[-1].next_scale)
    again.detach()


def test_pickling_mid_iteration_is_refused(fw):
    """Between unscale_/step and update a step's verdict is in flight (as torch's own scaler refuses)."""
    model = fw.model()
    scaler = fw.scaler()
    if fw.name == "torch":
        opt = fw.torch.optim.SGD(model.parameters(), lr=0.05)
        scaler.scale(model(fw.x).sum()).backward()
    else:
        opt = fw.paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
        with paddle_fp16_amp_state():
            scaler.scale(model(fw.paddle.to_tensor(fw.x)).sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(AssertionError, match="only be pickled at the beginning"):
        pickle.dumps(scaler)
    scaler.step(opt)
    scaler.update()
    assert pickle.loads(pickle.dumps(scaler)).stats.total_steps == 1


def test_a_torch_scaler_pickled_before_the_device_path_module_still_loads():
    """Older pickles hold ``_lag`` and ``_dev`` (always 0 and None: pickling reconciled first)."""
    fw = _Torch()
    model = fw.model()
    scaler = fw.scaler()
    fw.train(scaler, model, PATTERN)
    old = copy.deepcopy(scaler.__getstate__())  # as a pickle would: nothing shared with the original
    del old["_device_steps"]
    old.update(_lag=0, _dev=None)
    clone = type(scaler).__new__(type(scaler))
    clone.__setstate__(old)
    assert clone._lag == 0 and clone.state_dict() == scaler.state_dict()
    model2 = fw.model(seed=5)
    fw.copy_model(model, model2)
    (scales2, params2), (scales, params) = (
        fw.train(c, m, [True, True, False]) for c, m in ((clone, model2), (scaler, model))
    )
    assert scales2 == scales and all(np.array_equal(a, b) for a, b in zip(params2, params))
