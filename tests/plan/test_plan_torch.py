"""``ampsafe plan`` on torch: each engine's lines, applied to the model the report came from.

The reports are committed fixtures written by real runs (``fixtures/README.md`` gives the commands): T5's ``wo``
(HF issue #5651's overflow, as tests/hf builds it) and the MoE router of :mod:`plan_models`. Each test loads or
wraps the model with the plan's lines and shows the named modules float32 and the overflow the report saw gone
(and present without the lines).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import ampsafe  # noqa: E402
from ampsafe.plan import node_names, plan  # noqa: E402

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"
sys.path.insert(0, str(HERE))
from plan_models import ROUTER, export_router, router_batch, router_net  # noqa: E402


def _router_steps(model, steps: int = 3, **amp) -> list[float]:
    """Losses of ``steps`` SGD steps on the router batches under float16 autocast (``amp``: autocast options)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    losses = []
    for step in range(steps):
        x, y = router_batch(step)
        with torch.autocast("cpu", dtype=torch.float16, **amp):
            out = model(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        optimizer.zero_grad()
        loss.backward()
        if torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters()):
            optimizer.step()
        losses.append(float(loss))
    return losses


# -- HF: _keep_in_fp32_modules_strict through from_pretrained(dtype=torch.float16)
def test_hf_strict_list_loads_t5_with_the_overflowing_wo_in_float32_and_it_trains(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    sys.path.insert(0, str(HERE.parent / "hf"))
    from hf_models import batch, build, scale_past_float16

    result = plan(FIXTURES / "t5_heal.json", "hf")
    wo = "decoder.block.1.layer.2.DenseReluDense.wo"
    assert result.value == [wo]  # the run's measured module, not the heal's downstream path
    model = build("t5")
    scale_past_float16(model, wo, batch("t5", seed=0))
    model.save_pretrained(tmp_path)
    cls = type(model)
    for part in {type(m) for m in model.modules() if hasattr(type(m), "_keep_in_fp32_modules")}:
        monkeypatch.setattr(part, "_keep_in_fp32_modules", None)  # T5's own ["wo"] off: only the plan's list
        monkeypatch.setattr(part, "_keep_in_fp32_modules_strict", None)

    def load_and_train(code: str | None):
        if code:
            exec(code, {cls.__name__: cls, "path": str(tmp_path), "torch": torch})  # the plan, pasted
        loaded = cls.from_pretrained(tmp_path, dtype=torch.float16)
        seen = {}
        handle = loaded.get_submodule(wo).register_forward_hook(lambda m, a, out: seen.update(out=out.detach()))
        optimizer = torch.optim.SGD(loaded.parameters(), lr=1e-4)
        losses = []
        for step in range(2):
            loss = loaded(**batch("t5", seed=step)).loss
            optimizer.zero_grad()
            loss.backward()
            losses.append(loss.item())
            if torch.isfinite(loss):
                optimizer.step()
        handle.remove()
        return loaded, seen["out"], losses

    _, out, _ = load_and_train(None)
    assert not torch.isfinite(out).all()  # float16 throughout: wo overflows (T5 clamps what follows)
    loaded, out, losses = load_and_train(result.code)
    assert loaded.get_submodule(wo).weight.dtype == torch.float32 and loaded.lm_head.weight.dtype == torch.float16
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert all(torch.isfinite(torch.tensor(losses))), losses


# -- FSDP2 and DeepSpeed need a process group: one gloo rank in this process, removed after each test
@pytest.fixture
def one_rank(free_port):
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_fsdp2_lines_keep_the_router_float32_and_pure_float16_training_finite(one_rank):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    result = plan(FIXTURES / "router_heal.json", "fsdp2")
    assert result.value == [
        "fully_shard(model.layers[1].router, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32))"
    ]

    def sharded(code: str | None):
        model = router_net()
        if code:
            exec(code, {"model": model, "torch": torch})  # the plan, pasted: its own root line included
        else:
            fully_shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16))
        return model

    assert not all(map(torch.isfinite, map(torch.tensor, _router_steps(sharded(None), enabled=False))))
    model = sharded(result.code)
    seen = {}
    router = model.get_submodule(ROUTER)
    router.register_forward_hook(lambda m, a, out: seen.update(w=m.weight.dtype, out=out.detach()))
    losses = _router_steps(model, enabled=False)  # FSDP2's own float16, no autocast
    assert seen["w"] == torch.float32 and seen["out"].dtype == torch.float32 and torch.isfinite(seen["out"]).all()
    assert all(torch.isfinite(torch.tensor(losses))), losses


def test_deepspeed_plan_trains_with_the_router_computing_in_float32_and_every_forward_finite(one_rank, monkeypatch):
    deepspeed = pytest.importorskip("deepspeed")
    for key, value in {"DS_ACCELERATOR": "cpu", "LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(key, value)
    import importlib

    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    # as tests/deepspeed/ds_cpu.py, undone after the test: DeepSpeed's float16 gate passes only on AVX512-FP16 /
    # AMX CPUs (torch computes float16 on any), and its shm C++ op is skipped (gloo does the collectives)
    monkeypatch.setattr(CPU_Accelerator, "is_fp16_supported", lambda self: True)
    monkeypatch.setitem(
        vars(importlib.import_module("deepspeed.ops")).setdefault("__compatible_ops__", {}), "deepspeed_shm_comm", False
    )
    result = plan(FIXTURES / "router_heal.json", "deepspeed")
    assert result.value["data_types"]["keep_in_fp32_modules"] == [ROUTER]
    assert result.value["torch_autocast"] == {"enabled": True, "dtype": "float16"}

    def train(code: str | None) -> tuple[list[float], object]:
        model = router_net()
        ds_config = {"train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "SGD", "params": {"lr": 1e-3}}}
        ds_config["fp16"] = {"enabled": True}  # the user's config, which the plan changes
        scope = {"ds_config": ds_config, "model": model, "deepspeed": deepspeed, "ampsafe": ampsafe}
        if code:
            exec(code, scope)
            engine = scope["engine"]
        else:
            ds_config.pop("fp16")
            ds_config["torch_autocast"] = {"enabled": True, "dtype": "float16"}
            engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
        losses = []
        for step in range(3):
            x, y = router_batch(step)
            loss = torch.nn.functional.mse_loss(engine(x).float(), y)
            engine.backward(loss)
            engine.step()
            losses.append(float(loss))
        return losses, engine

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # the note's claim: under "fp16" the keep list leaves the router's parameters float16 (buffers only)
        config = {"train_micro_batch_size_per_gpu": 8, "fp16": {"enabled": True}, **result.value}
        config.pop("torch_autocast")
        model = router_net()
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        assert engine.module.get_submodule(ROUTER).weight.dtype == torch.float16
        losses, _ = train(None)  # torch_autocast alone: the router still computes in float16
        assert not all(map(torch.isfinite, map(torch.tensor, losses)))
        losses, engine = train(result.code)
    router = engine.module.get_submodule(ROUTER)
    seen = {}
    router.register_forward_hook(lambda m, a, out: seen.update(out=out.detach()))
    with torch.autocast("cpu", dtype=torch.float16):
        engine.module(router_batch(0)[0])
    assert router.weight.dtype == torch.float32 and seen["out"].dtype == torch.float32  # its compute, float32
    assert torch.isfinite(seen["out"]).all() and seen["out"].abs().max() > 65504  # past float16, held in float32
    assert all(torch.isfinite(torch.tensor(losses))), losses  # every forward finite: no overflow there
    assert all(torch.isfinite(p).all() for p in engine.module.parameters())


# -- ModelOpt AutoCast's nodes_to_exclude on the exported graph
def _float16_except(model, keep_fp32) -> object:
    """The graph with every node outside ``keep_fp32`` computing in float16 (float inputs cast to float16, its
    outputs cast back): what AutoCast's conversion does to the nodes it does not keep, node by node."""
    import onnx
    from onnx import TensorProto, helper

    inferred = onnx.shape_inference.infer_shapes(model)
    floats = {
        v.name
        for v in [*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output]
        if v.type.tensor_type.elem_type == TensorProto.FLOAT
    }
    floats |= {t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT}
    nodes = []
    for node in model.graph.node:
        if node.name in keep_fp32:
            nodes.append(node)
            continue
        for i, name in enumerate(node.input):
            if name in floats:
                nodes.append(helper.make_node("Cast", [name], [f"{name}@{node.name}"], to=TensorProto.FLOAT16))
                node.input[i] = f"{name}@{node.name}"
        outs = list(node.output)
        for i, name in enumerate(outs):
            if name in floats:
                node.output[i] = f"{name}@half"
        nodes.append(node)
        nodes += [helper.make_node("Cast", [f"{n}@half"], [n], to=TensorProto.FLOAT) for n in outs if n in floats]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def test_modelopt_nodes_to_exclude_name_the_routers_onnx_nodes_and_the_graph_runs_finite(tmp_path):
    onnx = pytest.importorskip("onnx")
    import re

    from onnx.reference import ReferenceEvaluator

    path = tmp_path / "model.onnx"
    model, x = export_router(path)
    result = plan(FIXTURES / "router_heal.json", "modelopt")
    graph = onnx.load(str(path))
    names = [n.name for n in graph.graph.node]
    matched = {n for n in names if any(re.match(p, n) for p in result.value)}  # AutoCast's re.match
    assert matched == {n for n in names if n.startswith("/layers.1/router/")} and matched  # the router's, no other
    exact = plan(FIXTURES / "router_heal.json", "modelopt", onnx=path)
    assert node_names(path, [ROUTER]) == {ROUTER: sorted(matched, key=names.index)}
    assert {n for n in names if any(re.match(p, n) for p in exact.value)} == matched
    # the scan of the same model names the same module: the same plan from an ampsafe.scan result
    scan = ampsafe.scan(router_net(), (x,))
    assert plan(scan, "modelopt").value == result.value
    (tmp_path / "scan.json").write_text(scan.to_json())  # as `ampsafe scan --json OUT` writes it
    assert plan(tmp_path / "scan.json", "modelopt").value == result.value

    softmax = {n for n in names if n.endswith("Softmax")}  # float32 under autocast, as in the run
    router_out = next(n.output[0] for n in graph.graph.node if n.name.startswith("/layers.1/router/"))
    outputs = {}
    for label, keep in (("without", softmax), ("with", softmax | matched)):
        half = _float16_except(onnx.load(str(path)), keep)
        half.graph.output.append(onnx.helper.make_empty_tensor_value_info(router_out))
        outputs[label] = ReferenceEvaluator(half).run(None, {"x": x.numpy()})
    import numpy as np

    assert not np.isfinite(outputs["without"][1]).all()  # the router's output overflows float16, as in the run
    assert all(np.isfinite(out).all() for out in outputs["with"])
    reference = model(x).detach().numpy()
    assert np.allclose(outputs["with"][0], reference, rtol=0.05, atol=0.05)


def test_modelopt_patterns_name_exactly_the_healed_t5_modules_nodes_in_hfs_own_onnx_export():
    """HF's T5 nests ``ModuleList`` blocks (no scope of their own) in called stacks: each pattern matches the
    nodes under its module in the exported graph and no other module's (``encoder``'s ``wo`` included)."""
    pytest.importorskip("transformers")
    onnx = pytest.importorskip("onnx")
    import re

    sys.path.insert(0, str(HERE.parent / "hf"))
    from hf_models import batch, build

    model = build("t5").eval()
    inputs = {k: batch("t5", seed=0)[k] for k in ("input_ids", "attention_mask", "labels")}
    import io

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (), buffer, kwargs={**inputs, "use_cache": False}, dynamo=False)
    names = [n.name for n in onnx.load_from_string(buffer.getvalue()).graph.node]
    result = plan(FIXTURES / "t5_heal.json", "modelopt")
    found = {path: [n for n in names if re.match(p, n)] for path, p in zip(result.modules, result.value)}
    ff = "decoder.block.1.layer.2.DenseReluDense"
    scopes = {f"{ff}.{m}": f"/decoder/block.1/layer.2/DenseReluDense/{m}/" for m in ("wi", "act", "dropout", "wo")}
    scopes |= {"decoder.final_layer_norm": "/decoder/final_layer_norm/", "lm_head": "/lm_head/"}
    scopes["decoder.block.1.layer.2.dropout"] = "/decoder/block.1/layer.2/dropout/"
    assert set(found) == set(scopes)
    for path, nodes in found.items():
        assert all(n.startswith(scopes[path]) for n in nodes), (path, nodes[:3])  # its own nodes, no other's
    for path in (OVERFLOW_WO, "decoder.block.1.layer.2.DenseReluDense.wi", "decoder.final_layer_norm", "lm_head"):
        assert found[path], path  # every module with weights has nodes (an eval-mode dropout exports none)
    wo = [n for n in names if "DenseReluDense/wo/" in n]
    assert len(wo) == 4 and found[OVERFLOW_WO] == ["/decoder/block.1/layer.2/DenseReluDense/wo/MatMul"]


OVERFLOW_WO = "decoder.block.1.layer.2.DenseReluDense.wo"
