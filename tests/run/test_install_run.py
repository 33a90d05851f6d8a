"""``ampsafe run``'s framework hooks are each backend's own (``Backend.install_run``), and every patch of the run,
the emulators and Paddle's op interception is recorded in one ledger (:mod:`ampsafe.core.ledger`) that puts
everything back."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ampsafe
from ampsafe._framework import REGISTRY, backend_named
from ampsafe.core.ledger import AttrPatches, live

RUN = Path(ampsafe.__file__).parent / "run"
FRAMEWORKS = ("torch", "paddle", "torchvision", "ppdet")


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_backend_installs_its_own_run_hooks(name):
    backend = backend_named(name)
    assert callable(getattr(backend, "install_run", None))
    module = importlib.import_module(f"ampsafe.{name}.run")
    assert callable(module.install)


def test_no_module_of_the_run_package_holds_framework_code():
    """No torch/Paddle function pair, no framework import at module level, no ``== "torch"`` fork."""
    found = []
    for path in sorted(RUN.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            found += [f"{path.name}: imports {n}" for n in names if n.split(".")[0] in FRAMEWORKS]
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                words = node.name.lower().strip("_").split("_")
                found += [f"{path.name}: defines {node.name}" for w in ("torch", "paddle") if w in words]
            if isinstance(node, ast.Compare):
                consts = [c.value for c in [node.left, *node.comparators] if isinstance(c, ast.Constant)]
                forks = [c for c in consts if c in ("torch", "paddle")]
                found += [f"{path.name}: compares with {c!r}" for c in forks]
    assert len(list(RUN.rglob("*.py"))) > 8  # the walk found the package
    assert not found, found


def test_undoing_an_older_patch_first_hands_its_original_to_the_newer_one():
    class Base:
        def f(self):
            return "base"

    class Sub(Base):
        pass

    first, second = AttrPatches("first"), AttrPatches("second")
    first.set(Sub, "f", lambda self: "first")
    second.set(Sub, "f", lambda self: "second")
    first.restore()  # the newer patch stays in force...
    assert Sub().f() == "second"
    second.restore()  # ...and then puts back what was there before both: nothing of Sub's own
    assert "f" not in vars(Sub) and Sub().f() == "base"
    assert not [p for p in live() if p[0] in ("first", "second")]


def test_a_failing_undo_step_leaves_the_other_patches_restored():
    class Owner:
        a = 1

    patches = AttrPatches("test")
    patches.set(Owner, "a", 2)

    def fail():
        raise RuntimeError("undo failed")

    patches.on_restore(fail)
    with pytest.raises(RuntimeError, match="undo failed"):
        patches.restore()
    assert Owner.a == 1 and not patches


# Each script snapshots the attributes of every object the run may patch, installs ampsafe run (--emulate-fp16 too)
# and trains a few steps, then uninstalls. Every patch in force must be on a snapshotted object (so the check below
# covers it), and every snapshotted attribute must be back afterwards, by identity, whether or not the ledger
# recorded it; an attribute a subclass inherited stays inherited.
CHECK = """
MISSING = object()
before = [(owner, dict(vars(owner))) for owner in OWNERS]
import ampsafe.auto as auto
from ampsafe.core.ledger import live

auto.install(emulate_fp16=True, quiet=True)
{train}
hooks = "ampsafe.torch.callhooks"  # the hooked model's class while it is hooked (the scaler's capture): not the run's
patched = [(owner, attr) for party, owner, attr in live() if party != hooks]
assert all(owner is type(model) for party, owner, _ in live() if party == hooks), live()
assert len(patched) >= {at_least}, patched
outside = sorted({{repr(owner) for owner, _ in patched if not any(owner is o for o in OWNERS)}})
assert not outside, "patched objects the test does not snapshot: " + ", ".join(outside)
auto.uninstall()
assert [(owner, attr) for party, owner, attr in live() if party != hooks] == [], live()
for owner, attrs in before:  # a class exactly as it was; a module's attributes (an import may add some)
    now = dict(vars(owner))
    if isinstance(owner, type):
        assert sorted(now) == sorted(attrs), (owner, set(now) ^ set(attrs))
    changed = [a for a, value in attrs.items() if now.get(a, MISSING) is not value]
    assert not changed, (owner, changed)
assert "step" not in vars(MySGD), "an inherited step was copied onto the subclass"
print("restored", len(patched))
"""

TORCH = """
import sys, torch, torch.amp.autocast_mode, torch.utils.checkpoint, torchvision.models.detection.generalized_rcnn as rcnn

class MySGD(torch.optim.SGD):
    pass

torch.optim.SGD([torch.zeros(1, requires_grad=True)])  # torch wraps SGD.step itself at its first construction
OWNERS = [torch, torch.amp, torch.amp.grad_scaler, torch.cuda.amp, torch.cuda.amp.grad_scaler, torch.cpu.amp,
          torch.cpu.amp.grad_scaler, torch.amp.grad_scaler.GradScaler, torch.amp.autocast_mode.autocast,
          torch.optim.Optimizer, torch.optim.SGD, MySGD, torch.Tensor, rcnn.GeneralizedRCNN, torch.utils.checkpoint, sys]
"""
TORCH_TRAIN = """
model = torch.nn.Linear(4, 2)
for cls in (MySGD, torch.optim.SGD):  # the subclass first: the guard wraps the step it inherits
    opt = cls(model.parameters(), lr=0.1)
    scaler = torch.cuda.amp.GradScaler()
    with torch.autocast("cuda"):
        loss = model(torch.randn(3, 4)).float().square().mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    model(torch.randn(3, 4)).sum().backward()
    opt.step()  # no scaler: the FP32 guard's
"""

PADDLE = """
import sys, paddle, paddle.amp.grad_scaler

class MySGD(paddle.optimizer.SGD):
    pass

auto_cast = sys.modules["paddle.amp.auto_cast"]
OWNERS = [paddle.amp, paddle.amp.grad_scaler, paddle.amp.grad_scaler.AmpScaler, auto_cast,
          paddle.optimizer.Optimizer, paddle.optimizer.SGD, MySGD, paddle.Tensor, sys]
"""
PADDLE_TRAIN = """
paddle.set_device("cpu")
model = paddle.nn.Linear(4, 2)
for cls in (MySGD, paddle.optimizer.SGD):  # the subclass first: the guard wraps the step it inherits
    opt = cls(learning_rate=0.1, parameters=model.parameters())
    scaler = paddle.amp.GradScaler()
    with paddle.amp.auto_cast():
        loss = model(paddle.randn([3, 4])).astype("float32").square().mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.clear_grad()
    model(paddle.randn([3, 4])).sum().backward()
    opt.step()  # no scaler: the FP32 guard's
"""


@pytest.mark.parametrize(
    "setup, train, at_least", [(TORCH, TORCH_TRAIN, 16), (PADDLE, PADDLE_TRAIN, 14)], ids=["torch", "paddle"]
)
def test_uninstall_puts_back_every_attribute_the_run_and_its_emulator_patched(setup, train, at_least):
    script = textwrap.dedent(setup) + CHECK.format(train=textwrap.dedent(train), at_least=at_least)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert int(proc.stdout.split()[-1]) >= at_least
