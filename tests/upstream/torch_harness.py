"""The few pieces of PyTorch's test machinery that its GradScaler tests (``torch_gradscaler_tests.py``, a recorded
copy) need, written for this project: torch's own ``torch.testing._internal.common_utils`` needs ``expecttest``,
which ampsafe does not install, and its device-type instantiation is more than a CPU run needs.

* the decorators (``onlyNativeDeviceTypes``, ``dtypes``, ``parametrize``, ``optims``, ``skipIfTorchDynamo``)
  only record what to run; :func:`cases` expands them into (test name, keyword arguments) pairs for device "cpu";
* :class:`TestCase` is ``unittest.TestCase`` with torch's ``assertEqual`` for tensors and numbers (elementwise,
  a number broadcast against a tensor, torch's dtype-based tolerances unless ``atol``/``rtol`` are given);
* ``optim_db`` / ``_get_optim_inputs_including_global_cliquey_kwargs``: the three optimizers the tests pick, with
  the constructor variants that take different paths through a scaler (the defaults, ``foreach=True``, and
  ``fused=True``, whose step unscales and skips itself) plus one of the optimizer's own (momentum / amsgrad),
  where torch's database holds many more that the scaler never sees (weight decay, maximize, ...).
"""

from __future__ import annotations

import itertools
import numbers
import unittest
from dataclasses import dataclass, field

import torch
import torch._inductor.config  # noqa: F401 (one recorded test patches its config)

TEST_MULTIGPU = False


def onlyNativeDeviceTypes(fn):
    return fn


def skipIfTorchDynamo(_reason: str = ""):
    return lambda fn: fn


def dtypes(*types):
    def record(fn):
        fn.upstream_dtypes = types
        return fn

    return record


def parametrize(names: str, values):
    def record(fn):
        fn.upstream_parametrize = ([n.strip() for n in names.split(",")], list(values))
        return fn

    return record


@dataclass
class OptimInfo:
    optim_cls: type
    variants: list = field(default_factory=list)


@dataclass
class OptimInput:
    kwargs: dict
    desc: str = ""


optim_db = [
    OptimInfo(torch.optim.Adam, [{"amsgrad": True}]),
    OptimInfo(torch.optim.AdamW, [{"amsgrad": True}]),
    OptimInfo(torch.optim.SGD, [{"momentum": 0.9}]),
]


def optims(infos, dtypes):
    def record(fn):
        fn.upstream_optims = (list(infos), list(dtypes))
        return fn

    return record


def _get_optim_inputs_including_global_cliquey_kwargs(device, dtype, optim_info, skip=()):
    """Constructor variants of ``optim_info``'s optimizer: the defaults, its own variants, and the global ones."""
    inputs = [{}, *optim_info.variants, {"foreach": True}, {"fused": True}]
    return [OptimInput(kwargs) for kwargs in inputs if not any(k in kwargs for k in skip)]


def cases(test_class) -> list:
    """(test name, keyword arguments, id) for every test of ``test_class`` on device "cpu"."""
    out = []
    for name in sorted(n for n in vars(test_class) if n.startswith("test_")):
        fn = getattr(test_class, name)
        axes = [[{"device": "cpu"}]]
        if hasattr(fn, "upstream_dtypes"):
            axes.append([{"dtype": d} for d in fn.upstream_dtypes])
        if hasattr(fn, "upstream_optims"):
            infos, types = fn.upstream_optims
            axes.append([{"optim_info": i} for i in infos])
            axes.append([{"dtype": d} for d in types])
        if hasattr(fn, "upstream_parametrize"):
            names, values = fn.upstream_parametrize
            axes.append([dict(zip(names, v if isinstance(v, tuple) else (v,))) for v in values])
        for combo in itertools.product(*axes):
            kwargs = {k: v for part in combo for k, v in part.items()}
            out.append((name, kwargs, name + _suffix(kwargs)))
    return out


def _suffix(kwargs: dict) -> str:
    parts = []
    for key, value in kwargs.items():
        if key == "device":
            continue
        if key == "optim_info":
            parts.append(value.optim_cls.__name__)
        elif key == "dtype":
            parts.append(str(value).replace("torch.", ""))
        else:
            parts.append(f"{key}_{value}")
    return "[" + "-".join(parts) + "]" if parts else ""


class TestCase(unittest.TestCase):
    """``unittest.TestCase`` with torch's ``assertEqual`` for tensors and numbers."""

    def assertEqual(self, x, y, msg=None, *, atol=None, rtol=None, **_ignored):  # noqa: N802 (unittest's name)
        tensors = isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor)
        numbers_ = isinstance(x, numbers.Number) and isinstance(y, numbers.Number)
        if not (tensors or numbers_):
            return super().assertEqual(x, y, msg)
        tx, ty = _dense(x), _dense(y)
        dtype = torch.promote_types(tx.dtype, ty.dtype)
        tx, ty = tx.to(dtype), ty.to(dtype)
        if tx.shape != ty.shape and (tx.numel() == 1 or ty.numel() == 1):
            tx, ty = torch.broadcast_tensors(tx, ty)
        if (atol is None) != (rtol is None):
            atol, rtol = atol or 0.0, rtol or 0.0
        torch.testing.assert_close(
            tx, ty, atol=atol, rtol=rtol, equal_nan=True, msg=None if msg is None else str(msg), check_stride=False
        )


def _dense(value) -> torch.Tensor:
    tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value)
    tensor = tensor.detach().cpu()
    return tensor.to_dense() if tensor.is_sparse else tensor
