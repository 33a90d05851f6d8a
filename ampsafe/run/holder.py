"""The object the user holds, and where the model ampsafe resolved sits in it: report paths the user can apply.

A scaler resolves the smallest module covering its optimizer's parameters (``Backend.owner_of``): Lightning's
``LightningModule.net`` (an ``nn.Sequential``), ``GPT2LMHeadModel.transformer`` (the LM head is tied to the
embedding, so ``GPT2Model`` covers every parameter). Paths relative to that inner module are rejected by the
model the user builds (``ConfigError: the model has no module '0'``). The holder is the outermost live module
that contains the resolved one, past the wrappers a trainer adds (DDP, DataParallel, FSDP, Lightning's and
Fabric's wrappers) and past ultralytics' ``YOLO`` object to its ``.model`` (``YOLO().model`` is what a user
patches). Found once per scaler (one ``gc`` walk), while the model is alive.
"""

from __future__ import annotations

from ..core.modpath import join

__all__ = ["holder_of", "prefixed"]

_WRAPPERS = {
    "DistributedDataParallel",
    "DataParallel",
    "FullyShardedDataParallel",
    "_LightningModuleWrapperBase",
    "_FabricModule",
    "OptimizedModule",
}


def _unwrapped(root, model, backend):
    """Past wrappers (to the child that holds ``model``) and past an ultralytics ``Model`` to its ``.model``."""
    while root is not model:
        cls = type(root)
        wrapper = cls.__name__ in _WRAPPERS or (
            cls.__module__.startswith("ultralytics.engine.model")
            or any(c.__module__ == "ultralytics.engine.model" and c.__name__ == "Model" for c in cls.__mro__)
        )
        if not wrapper:
            return root
        inner = next((c for c in backend.children(root) if any(m is model for m in backend.modules(c).values())), None)
        if inner is None:
            return root
        root = inner
    return root


def holder_of(backend, model) -> tuple[object, str]:
    """(the outermost live module holding ``model``, ``model``'s path in it, ``""`` when it is that module)."""
    if model is None:
        return None, ""
    from ..core.backend import live_roots

    try:
        roots = [r for r in live_roots(backend) if any(m is model for m in backend.modules(r).values())]
    except Exception:  # noqa: BLE001 - naming only: the resolved model stands
        return model, ""
    if not roots:
        return model, ""
    root = _unwrapped(max(roots, key=lambda r: len(backend.modules(r))), model, backend)
    path = next((p for p, m in backend.modules(root).items() if m is model), None)
    return (root, path) if path is not None else (model, "")


def prefixed(prefix: str, paths) -> list[str]:
    """Module paths relative to the resolved model -> relative to its holder (``prefix``: its path there)."""
    return [join(prefix, p) for p in paths]
