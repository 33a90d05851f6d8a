"""ModelOpt AutoCast itself, applying ``ampsafe plan --to modelopt``'s ``nodes_to_exclude`` to the exported graph.

``nvidia-modelopt[onnx]`` pins ``onnx~=1.21`` (this project's test set pins 1.23), so the suite's environment has
ModelOpt without its ONNX extra and these tests skip there; ``bench/modelopt_env.sh`` builds an environment where
they run (the project's packages plus the extra's, ``onnx`` 1.21 first on the path).

``data_max`` is set past any value so that AutoCast's own range check (its reference run keeps nodes whose values
pass ``data_max``, 512 by default, in float32) leaves the choice to ``nodes_to_exclude``: what is measured is the
plan, not AutoCast's calibration.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip(
    "modelopt.onnx.autocast",
    exc_type=ImportError,  # modelopt raises ImportError, not ModuleNotFoundError, without its extra
    reason="ModelOpt AutoCast needs nvidia-modelopt[onnx] (onnx~=1.21): run in the environment bench/modelopt_env.sh makes",
)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from plan_models import export_router  # noqa: E402

from ampsafe.plan import plan  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"
SCOPE = "/layers.1/router/"  # the exporter's scope of ROUTER's nodes (ampsafe/plan/onnx_names.py)


def _exported(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    path = tmp_path / "model.onnx"
    model, x = export_router(path)
    with torch.no_grad():
        reference = model(x).numpy()
    return path, x.numpy(), reference


def _convert_and_run(path: Path, x: np.ndarray, nodes_to_exclude: list[str]):
    """AutoCast's float16 graph (keeping ``nodes_to_exclude``) run by onnxruntime on the CPU on ``x``: the names of
    its nodes that compute in float32, the graph's output, and the router's output."""
    import onnx
    import onnxruntime
    from modelopt.onnx.autocast import convert_to_mixed_precision
    from onnx import TensorProto

    converted = convert_to_mixed_precision(
        onnx_path=str(path),
        low_precision_type="fp16",
        nodes_to_exclude=nodes_to_exclude,
        data_max=float("inf"),
        keep_io_types=True,
    )
    inferred = onnx.shape_inference.infer_shapes(converted)
    dtypes = {v.name: v.type.tensor_type.elem_type for v in inferred.graph.value_info}
    kept = {
        n.name for n in converted.graph.node if n.op_type != "Cast" and dtypes.get(n.output[0]) == TensorProto.FLOAT
    }
    (router_out,) = [n.output[0] for n in converted.graph.node if n.name.startswith(SCOPE) and n.op_type != "Cast"]
    converted.graph.output.append(onnx.helper.make_empty_tensor_value_info(router_out))
    session = onnxruntime.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"])
    out, router = session.run(None, {"x": x})
    return kept, out, router


def test_autocast_keeps_the_planned_router_in_float32_and_its_output_stays_finite(tmp_path):
    path, x, reference = _exported(tmp_path)
    patterns = plan(FIXTURES / "router_heal.json", "modelopt").value
    kept, out, router = _convert_and_run(path, x, patterns)
    assert {n for n in kept if n.startswith(SCOPE)}, sorted(kept)  # the router's nodes compute in float32
    assert router.dtype == np.float32 and np.isfinite(router).all() and np.abs(router).max() > 65504
    assert np.isfinite(out).all()
    assert np.allclose(out, reference, rtol=0.05, atol=0.05), np.abs(out - reference).max()


def test_autocast_without_the_plan_overflows_in_the_router(tmp_path):
    """Every node in float16: the router's logits are inf (onnxruntime's softmax after them still returns finite
    weights, so the graph's output alone would not show it)."""
    path, x, _ = _exported(tmp_path)
    kept, _, router = _convert_and_run(path, x, [])
    assert not any(n.startswith(SCOPE) for n in kept), sorted(kept)
    assert router.dtype == np.float16 and np.isinf(router).any()
