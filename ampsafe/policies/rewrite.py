"""``rewrite``: exact rewrites of known risky ops; today the logistic ``reciprocal(1 + exp(-z))``.

DBNet's head computes its step function as ``paddle.reciprocal(1 + paddle.exp(-k * (x - y)))``. Under O2
``exp`` overflows float16 and the backward multiplies 0 by inf; keeping ``exp`` in float32 is not enough,
because the following ``add`` is cast back to float16. ``sigmoid(z)`` is the same function, bounded, with a
finite gradient. The rewrite is made on the module's class source (every method the class defines that
contains ``reciprocal(1 + <ns>.exp(X))``, ``reciprocal(<ns>.exp(X) + 1)`` or ``1 / (1 + <ns>.exp(X))``
becomes ``<ns>.sigmoid(-(X))``), compiled once per class and installed by class swap, so it costs nothing at
run time and exported graphs see a plain sigmoid. Works the same for torch and Paddle (``<ns>`` is whatever
namespace the code called ``exp`` from).
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types
from dataclasses import dataclass

from .._framework import REGISTRY
from ..core.swaps import SwapMixin, swap
from . import Change, PatchContext, Plan, PolicyConfig, action, path_starts, register

__all__ = ["Rewrite", "LogisticRewrite", "logistic_rewrites", "plan_rewrite"]


@dataclass(frozen=True)
class Rewrite(PolicyConfig):
    """``policy=Rewrite()`` (shorthand ``"rewrite"``): exact rewrites of known risky ops, nothing else."""

    name = "rewrite"


def _is_one(node) -> bool:
    return isinstance(node, ast.Constant) and node.value == 1 and not isinstance(node.value, bool)


def _exp_call(node):
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "exp"
        and len(node.args) == 1
        and not node.keywords
    ):
        return node
    return None


def _one_plus_exp(node):
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        if _is_one(node.left):
            return _exp_call(node.right)
        if _is_one(node.right):
            return _exp_call(node.left)
    return None


class _Logistic(ast.NodeTransformer):
    def __init__(self):
        self.count = 0

    def visit_Call(self, node):
        self.generic_visit(node)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "reciprocal" and len(node.args) == 1:
            exp = _one_plus_exp(node.args[0])
            if exp is not None:
                return self._sigmoid(exp, node)
        return node

    def visit_BinOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.Div) and _is_one(node.left):
            exp = _one_plus_exp(node.right)
            if exp is not None:
                return self._sigmoid(exp, node)
        return node

    def _sigmoid(self, exp, old):
        self.count += 1
        func = ast.Attribute(value=exp.func.value, attr="sigmoid", ctx=ast.Load())
        new = ast.Call(func=func, args=[ast.UnaryOp(op=ast.USub(), operand=exp.args[0])], keywords=[])
        return ast.copy_location(new, old)


def _rewrite_function(fn):
    """``fn`` with its logistic patterns replaced, or None when it has none (or its source is unavailable).

    The rewritten def is compiled inside an outer function whose parameters are ``fn``'s free variables, so
    the new function gets ``fn``'s own closure cells (``super()``'s ``__class__`` included)."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None
    if "exp" not in source:
        return None
    tree = ast.parse(source)
    func_def = tree.body[0]
    if not isinstance(func_def, ast.FunctionDef):
        return None
    func_def.decorator_list = []
    transformer = _Logistic()
    transformer.visit(func_def)
    if not transformer.count:
        return None
    freevars = fn.__code__.co_freevars
    outer = ast.FunctionDef(
        name="__ampsafe_outer__",
        args=ast.arguments(
            posonlyargs=[], args=[ast.arg(arg=v) for v in freevars], kwonlyargs=[], kw_defaults=[], defaults=[]
        ),
        body=[func_def, ast.Return(value=ast.Name(id=func_def.name, ctx=ast.Load()))],
        decorator_list=[],
        returns=None,
        type_params=[],
    )
    module = ast.Module(body=[outer], type_ignores=[])
    ast.fix_missing_locations(module)
    filename = f"<ampsafe rewrite of {fn.__module__}.{fn.__qualname__}>"
    namespace: dict = {}
    exec(compile(module, filename, "exec"), fn.__globals__, namespace)  # noqa: S102 - our own rewritten AST
    code = next(c for c in namespace["__ampsafe_outer__"].__code__.co_consts if isinstance(c, types.CodeType))
    cells = dict(zip(freevars, fn.__closure__ or ()))
    new = types.FunctionType(
        code, fn.__globals__, fn.__name__, fn.__defaults__, tuple(cells[v] for v in code.co_freevars)
    )
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    new.__doc__ = fn.__doc__
    new.__module__ = fn.__module__
    new.__ampsafe_rewritten__ = True
    return new


@functools.cache
def logistic_rewrites(cls: type) -> dict:
    """Method name -> rewritten function for every method of ``cls`` (and its user-defined bases) that
    computes a logistic through ``exp``. Empty when there is nothing to rewrite."""
    out: dict = {}
    for klass in cls.__mro__:
        mod = getattr(klass, "__module__", "") or ""
        if mod.partition(".")[0] in (*REGISTRY, "builtins") or issubclass(klass, SwapMixin):
            continue  # a registered framework's classes and ampsafe's own mixins: nothing to rewrite there
        for name, value in vars(klass).items():
            if name in out or not inspect.isfunction(value):
                continue
            new = _rewrite_function(value)
            if new is not None:
                out[name] = new
    return out


class LogisticRewrite(SwapMixin):
    """Mixin whose class namespace holds the rewritten methods of the base class."""

    _ampsafe_protection = "rewrite"

    @classmethod
    def class_namespace(cls, base: type) -> dict:
        return dict(logistic_rewrites(base))


@action("rewrite", protection=LogisticRewrite._ampsafe_protection)
def swap_rewrite(swaps, module, change: Change) -> None:
    swap(module, LogisticRewrite)


@register(Rewrite)
def plan_rewrite(ctx: PatchContext) -> Plan:
    plan = Plan()
    if ctx.paths is not None:
        targets = path_starts(ctx.paths)
    elif ctx.report is not None:
        targets = [op.module for op in ctx.report.risky_ops if not op.protected_by]
    else:
        targets = list(ctx.modules)  # exact rewrites are safe everywhere: look at every module
    for path in dict.fromkeys(targets):
        module = ctx.modules.get(path)
        if module is None or not logistic_rewrites(type(module)):
            if ctx.paths is not None:
                plan.skipped[path] = "no reciprocal(1 + exp(z)) in its class's methods"
            continue
        if ctx.allowed(path, plan, kind="rewrite"):
            names = ", ".join(sorted(logistic_rewrites(type(module))))
            plan.add(Change("rewrite", path, f"reciprocal(1 + exp(-z)) -> sigmoid(z) in {names}"))
    return plan
