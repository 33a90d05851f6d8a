"""Module paths as ONNX node names: what ``torch.onnx.export(..., dynamo=False)`` calls a module's nodes.

Why a rule and not a guess: the TorchScript exporter names each node ``/<scope>/.../<OpType>[_N]``, one scope per
module whose ``forward`` ran, each spelled as the module's qualified name from its last non-numeric atom on
(``torch/onnx/_internal/torchscript_exporter/utils.py``, ``_unqualified_variable_name``: ``block.1`` ->
``block.1``, ``block.1.layer.2`` -> ``layer.2``, ``0.1`` -> ``0.1``). A ``ModuleList`` never runs ``forward``, so
it has no scope; a ``Sequential`` does. From a path alone the two look alike, so a container whose child is
indexed (``block`` in ``block.1``) is an optional scope in the pattern. ModelOpt AutoCast matches its
``nodes_to_exclude`` with ``re.match`` on the node name (``modelopt/onnx/autocast/nodeclassifier.py``,
``DisabledNodeNameRegexRule``), so each pattern is anchored at the start and ends at the module's own scope: it
matches every node the module's forward made, its submodules' included, and no other module's.

The exporter torch 2.14 picks by default (``dynamo=True``) needs ``onnxscript`` and names nodes otherwise; these
patterns are for ``dynamo=False`` graphs, and :func:`node_names` says so when a graph has no node under a module.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Union

from ..errors import ConfigError

__all__ = ["scope_pattern", "node_names"]


def _scope(atoms: list[str]) -> str:
    """The exporter's scope name of the module at ``atoms``: from its last non-numeric atom on."""
    for i in range(len(atoms) - 1, -1, -1):
        if not atoms[i].isnumeric():
            return ".".join(atoms[i:])
    return ".".join(atoms)


def scope_pattern(path: str) -> str:
    """The regex (for ``re.match``) of the ONNX node names made by the module at ``path`` (``""``: the root, every
    node)."""
    atoms = path.split(".") if path else []
    out = "^/"
    for i in range(len(atoms)):
        part = re.escape(_scope(atoms[: i + 1])) + "/"
        indexed_child = i + 1 < len(atoms) and atoms[i + 1].isnumeric()
        out += f"(?:{part})?" if indexed_child else part
    return out


def node_names(onnx_model: Union[str, Path, Any], paths) -> dict[str, list[str]]:
    """path -> the names of the nodes of ``onnx_model`` (a file or an ``onnx.ModelProto``) its pattern matches (an
    empty list for a module that exported no node, as an eval-mode dropout). Raises ``ConfigError`` when no module
    has a node: the graph was not exported with the module scopes, or from another model."""
    import onnx

    model = onnx.load(str(onnx_model), load_external_data=False) if isinstance(onnx_model, (str, Path)) else onnx_model
    names = [n.name for n in model.graph.node]
    out = {p: [n for n in names if re.match(scope_pattern(p), n)] for p in paths}
    if not any(out.values()):
        raise ConfigError(
            f"no node of the ONNX graph lies under {', '.join(out)}: export the model with "
            "`torch.onnx.export(model, args, path, dynamo=False)` (its nodes carry the module scopes) and check that "
            "these modules' forward runs in the exported call."
        )
    return out
