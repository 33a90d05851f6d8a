"""A PaddleDetection training command shaped like ppdet's ``tools/train.py`` (knows nothing about ampsafe):
``load_config`` + ``-o`` overrides via ``merge_config``, ``--amp`` sets ``cfg["amp"]``, absent ``use_npu`` / ``use_xpu`` / ``use_mlu`` off, the device from
``use_gpu``, ``check_gpu``, then ``ppdet.engine.Trainer(cfg, mode="train")``, ``load_weights`` of
``pretrain_weights`` when set, and ``trainer.train()``.

After training, one line per fact the tests read: the scaler class the Trainer built, its scale and steps.

ppdet 2.6.0 predates Paddle 3, where ``paddle.shape(x)[0]`` became a 0-D tensor: its RPN proposal code concatenates
those, which Paddle 3 refuses. The script applies the version-compatibility fix a user of that ppdet on that Paddle
needs (``ppdet_2_6_on_paddle_3``, one ``script: compat:`` line when it applies); ppdet's own code runs unchanged.
"""

import argparse
import ast
import importlib

import paddle
import ppdet
from ppdet.core.workspace import load_config, merge_config
from ppdet.engine import Trainer
from ppdet.utils.check import check_gpu

parser = argparse.ArgumentParser()
parser.add_argument("-c", "--config", required=True)
parser.add_argument("-o", "--opt", nargs="*", default=[], help="KEY=VALUE overrides (dots for nesting)")
parser.add_argument("--amp", action="store_true", default=False)
parser.add_argument("--save-state", default="", help="after training, paddle.save the model's state_dict here")
args = parser.parse_args()


def parse_overrides(pairs):
    """``a.b=1`` -> ``{"a": {"b": 1}}`` (values read as Python literals when they parse), as ppdet's ArgsParser."""
    out = {}
    for pair in pairs:
        key, _, raw = pair.partition("=")
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        node = out
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


class _ConcatOf0DAsPaddle2:
    """The name ``paddle`` inside a ppdet module: the real ``paddle`` (every attribute looked up on it at each use)
    except ``concat``, which first reshapes the 0-D tensors of its list to shape [1], as Paddle 2.x's
    ``paddle.shape(x)[0]`` were, then calls ``paddle.concat``."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        return getattr(self._module, name)

    def concat(self, x, *rest, **kwargs):
        if isinstance(x, (list, tuple)):
            x = [t.reshape([1]) if isinstance(t, paddle.Tensor) and t.ndim == 0 else t for t in x]
        return self._module.concat(x, *rest, **kwargs)


# the ppdet 2.6.0 modules of a Faster R-CNN training step that concatenate per-image ``paddle.shape(x)[0]``s
COMPAT_MODULES = ("ppdet.modeling.proposal_generator.rpn_head", "ppdet.modeling.proposal_generator.target")


def ppdet_2_6_on_paddle_3():
    """Version compatibility, not a change to ppdet's logic: ppdet 2.6.0's ``RPNHead._gen_proposal`` and
    ``target.generate_proposal_target`` collect ``paddle.shape(rois)[0]`` per image and ``paddle.concat`` them; on
    Paddle >= 3 those are 0-D and concat raises "The axis is expected to be in range of [0, 0)". Only those modules'
    ``paddle`` name is proxied."""
    if int(paddle.__version__.split(".")[0]) < 3 or not ppdet.__version__.startswith("2.6."):
        return
    for name in COMPAT_MODULES:
        importlib.import_module(name).paddle = _ConcatOf0DAsPaddle2(paddle)
    print(
        f"script: compat: ppdet {ppdet.__version__} on Paddle {paddle.__version__}: paddle.concat in "
        f"{', '.join(COMPAT_MODULES)} reshapes 0-D tensors to [1]",
        flush=True,
    )


ppdet_2_6_on_paddle_3()
cfg = load_config(args.config)
merge_config(parse_overrides(args.opt))
cfg["amp"] = args.amp
for flag in ("use_gpu", "use_npu", "use_xpu", "use_mlu"):  # tools/train.py: absent devices are off
    if flag not in cfg:
        cfg[flag] = False
paddle.set_device("gpu" if cfg.use_gpu else "cpu")
check_gpu(cfg.use_gpu)

trainer = Trainer(cfg, mode="train")
if cfg.get("pretrain_weights"):
    trainer.load_weights(cfg.pretrain_weights)

captured = []
original_scaler = paddle.amp.GradScaler


def recording_scaler(*a, **k):  # only to print what the Trainer built; the Trainer calls paddle.amp.GradScaler
    scaler = original_scaler(*a, **k)
    captured.append((scaler, k))
    return scaler


paddle.amp.GradScaler = recording_scaler
trainer.train()
paddle.amp.GradScaler = original_scaler
for scaler, kwargs in captured:
    print(
        f"script: Trainer scaler {type(scaler).__module__}.{type(scaler).__name__} built with "
        f"enable={kwargs.get('enable')}; enabled {scaler.is_enable()}, scale {float(scaler.get_loss_scaling())}",
        flush=True,
    )
if args.save_state:
    paddle.save(trainer.model.state_dict(), args.save_state)
print(f"script: done, amp {trainer.use_amp}, use_gpu {cfg.use_gpu}", flush=True)
