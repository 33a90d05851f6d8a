"""The per-instance call hooks patch a class's ``__call__`` through the process ledger (``core.ledger``):
the patch is listed by ``live()`` while the class has hooked instances, undone when the last one goes (removed or
collected), and undoing it never disturbs another party's patch of the same ``__call__``."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from ampsafe.core.ledger import AttrPatches, live  # noqa: E402
from ampsafe.torch.callhooks import hooked, pre_hook  # noqa: E402

PARTY = "ampsafe.torch.callhooks"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(x)


def _patched(cls) -> list[str]:
    return [party for party, owner, attr in live() if owner is cls and attr == "__call__"]


def test_the_class_patch_is_in_the_ledger_while_an_instance_is_hooked():
    a, b = Net(), Net()
    seen = []
    first = pre_hook(a, lambda args, kwargs: seen.append("a"))
    second = pre_hook(b, lambda args, kwargs: seen.append("b"))
    assert _patched(Net) == [PARTY]  # one patch for the class, however many instances
    first.remove()
    assert _patched(Net) == [PARTY] and hooked(b) and not hooked(a)
    a(torch.ones(1, 3))
    b(torch.ones(1, 3))
    assert seen == ["b"]
    second.remove()
    assert _patched(Net) == [] and "__call__" not in vars(Net)

    c = Net()
    pre_hook(c, lambda args, kwargs: None)  # never removed: released when the module is collected
    assert _patched(Net) == [PARTY]
    del c
    gc.collect()
    assert _patched(Net) == [] and "__call__" not in vars(Net)


def test_releasing_the_hooks_first_keeps_a_later_patch_of_the_same_call():
    model = Net()
    seen = []
    handle = pre_hook(model, lambda args, kwargs: seen.append("hook"))
    other = AttrPatches("a later party")
    hooked_call = Net.__call__

    def counting(self, *args, **kwargs):
        seen.append("other")
        return hooked_call(self, *args, **kwargs)

    other.set(Net, "__call__", counting)
    model(torch.ones(1, 3))
    assert seen == ["other", "hook"]

    handle.remove()  # the older patch goes first: the later one stays in place, now over the original
    assert Net.__call__ is counting and _patched(Net) == ["a later party"]
    seen.clear()
    assert model(torch.ones(1, 3)).shape == (1, 2) and seen == ["other"]

    other.restore()
    assert "__call__" not in vars(Net) and _patched(Net) == []
    assert not other.undo(Net, "__call__")  # nothing of that party's left to undo
