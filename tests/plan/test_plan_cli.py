"""``ampsafe plan`` as a command and an API: every engine registered, bad input refused with what to do, the
Megatron flags chosen by what the module is. Framework-free (reads the committed reports only); the engines'
lines are applied to models in test_plan_torch.py and test_plan_paddle.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ampsafe.cli import COMMANDS
from ampsafe.cli import main as cli
from ampsafe.errors import ConfigError
from ampsafe.plan import ENGINES, megatron_flag, plan, scope_pattern

FIXTURES = Path(__file__).parent / "fixtures"


def test_every_engine_has_a_formatter_and_the_command_is_registered():
    assert set(ENGINES) == {"hf", "deepspeed", "fsdp2", "megatron", "paddle", "modelopt"}
    assert COMMANDS["plan"][0] == "ampsafe.plan.cli"


def test_the_command_prints_the_plan_and_its_json(capsys):
    assert cli(["plan", str(FIXTURES / "router_heal.json"), "--to", "fsdp2"]) == 0
    out = capsys.readouterr().out
    assert "fully_shard(model.layers[1].router, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float32))" in out
    assert cli(["plan", str(FIXTURES), "--to", "megatron", "--json"]) != 0  # a folder without report.json
    capsys.readouterr()
    assert cli(["plan", str(FIXTURES / "router_heal.json"), "--to", "megatron", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["engine"] == "megatron" and data["value"] == ["--moe-router-dtype fp32"]


@pytest.mark.parametrize(
    "args, words",
    [
        (["missing.json", "--to", "hf"], "no report at missing.json"),
        (["clean", "--to", "fsdp2"], "names no module to keep in float32"),
        (["router_heal.json", "--to", "hf"], "not an HF transformers model"),
        (["router_heal.json", "--to", "paddle"], "this run trained a torch model"),
        (["paddle_o2_heal.json", "--to", "modelopt"], "this run trained a paddle model"),
        (["notjson", "--to", "hf"], "not readable JSON"),
    ],
)
def test_bad_input_gets_a_clear_error_and_changes_nothing(tmp_path, capsys, args, words):
    for name in ("router_heal.json", "paddle_o2_heal.json"):
        shutil.copy(FIXTURES / name, tmp_path / name)
    (tmp_path / "clean").mkdir()
    (tmp_path / "clean" / "report.json").write_text(json.dumps({"pid": 1, "scalers": []}))
    (tmp_path / "notjson").write_text("{")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    argv = [str(tmp_path / args[0]) if args[0] != "missing.json" else "missing.json", *args[1:]]
    assert cli(["plan", *argv]) == 1
    assert words in capsys.readouterr().err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


def test_an_unknown_engine_is_refused_by_the_command_and_the_api(capsys):
    with pytest.raises(SystemExit):
        cli(["plan", str(FIXTURES / "router_heal.json"), "--to", "tensorrt"])
    assert "invalid choice: 'tensorrt'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="unknown engine 'tensorrt': choose one of hf, deepspeed"):
        plan(FIXTURES / "router_heal.json", "tensorrt")


def test_megatron_flags_match_the_router_and_the_residual_stream_and_say_when_none_does():
    assert megatron_flag("layers.1.router") == "--moe-router-dtype fp32"
    assert megatron_flag("model.layers.3.block_sparse_moe.gate") == "--moe-router-dtype fp32"
    assert megatron_flag("model.layers.3") == "--fp32-residual-connection"  # a whole block: the residual stream
    assert megatron_flag("transformer.h.0") == "--fp32-residual-connection"
    assert megatron_flag("model.layers.3.mlp.down_proj") is None
    t5 = plan(FIXTURES / "t5_heal.json", "megatron")
    wo = "decoder.block.1.layer.2.DenseReluDense.wo"
    assert t5.value == [] and t5.details[wo] == "" and "None matches" in t5.note and wo in t5.note
    assert t5.code.startswith("#")  # nothing to pass


def test_the_onnx_scope_pattern_follows_the_torchscript_exporters_names():
    # a ModuleList has no scope of its own (never called); its indexed child is named from the list's name on
    pattern = scope_pattern("decoder.block.1.layer.2.DenseReluDense.wo")
    import re

    assert re.match(pattern, "/decoder/block.1/layer.2/DenseReluDense/wo/MatMul")
    assert re.match(pattern, "/decoder/block/block.1/layer/layer.2/DenseReluDense/wo/MatMul")  # Sequential parents
    assert not re.match(pattern, "/encoder/block.1/layer.2/DenseReluDense/wo/MatMul")
    assert not re.match(pattern, "/decoder/block.1/layer.2/DenseReluDense/wi/MatMul")
    assert not re.match(scope_pattern("head"), "/header/Gemm")
