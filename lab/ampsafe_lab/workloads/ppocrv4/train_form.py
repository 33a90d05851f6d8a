"""The shipped PP-OCRv4 det weights in the form PaddleOCR's trainer builds: a ``.pdparams`` for ``tools/train.py``.

    path = write_training_params("out/ppocrv4_det_train.pdparams")           # statistics of identity BNs
    path = write_training_params(out, calibration_images=images)             # or BNs calibrated on pages
    python tools/train.py -c configs/det/ch_PP-OCRv4/ch_PP-OCRv4_det_student.yml -o Global.pretrained_model=<path>

Why a second form: the shipped export is re-parameterized (each ``LearnableRepLayer`` of PPLCNetV3 is one
``reparam_conv`` with a bias), but ``tools/train.py`` builds the model from the config, where each rep layer
still has its branches (``conv_kxk`` conv+BN, a 1x1 conv+BN when k > 1, an identity BN when the shape allows)
and no option fuses them. PaddleOCR's ``load_pretrained_params`` copies by name, warns about file tensors the
model lacks and leaves model tensors the file lacks at their random initialization without a word: the shipped
tensors would reach none of the rep layers. So every tensor of the training form is written here, and
:func:`training_form_state` checks that each one got a value and that each shipped tensor was used.

Per rep layer: ``conv_kxk.0.conv.weight`` = the fused kernel (same k x k shape); ``conv_kxk.0.bn`` turns
``conv(x)`` into ``conv(x) + bias``; every other branch's BN gets gamma 0 and beta 0, so that it adds exactly 0
in eval and in train mode (its conv keeps its seeded initialization, so that it can learn). The BN that
carries the kernel is either the identity (running mean 0, variance 1 - eps, gamma 1, beta = bias: exact in
eval mode, but in train mode it normalizes each channel to the batch's statistics and loses the trained
scale) or, with ``calibration_images``, calibrated: running mean m and variance v of ``conv(x)`` per channel on
those images (a train-mode forward of the shipped network, as the trainer runs it), gamma sqrt(v + eps), beta
bias + m, the same function in eval mode and close to it in train mode on similar pages. Stride-2 rep layers
own an ``act`` their forward never calls: it stays 1 / 0. All other tensors are the shipped ones by name;
DBHead's threshold branch (not shipped) is the workload's seeded initialization.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ampsafe.errors import ConfigError

__all__ = ["training_form_state", "write_training_params", "rep_layers"]

REP_LAYER = "LearnableRepLayer"  # PaddleOCR's class in ppocr/modeling/backbones/rec_lcnetv3.py


def rep_layers(model) -> dict:
    """``{name: layer}`` of the un-fused ``LearnableRepLayer`` s in a PaddleOCR-built model."""
    return {name: layer for name, layer in model.named_sublayers() if type(layer).__name__ == REP_LAYER}


def _calibrate(model, names: list[str], images: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per-channel (mean, variance) of each ``<name>.reparam_conv``'s output without its bias, in one train-mode
    forward of ``images`` (``model``'s state is restored afterwards: its BN running statistics stay shipped)."""
    import paddle

    layers = dict(model.named_sublayers())
    saved = {k: v.numpy().copy() for k, v in model.state_dict().items()}
    stats, handles = {}, []
    for name in names:
        conv = layers[f"{name}.reparam_conv"]

        def keep(layer, inputs, out, name=name):
            y = out.numpy().astype(np.float64) - layer.bias.numpy().astype(np.float64)[None, :, None, None]
            stats[name] = (y.mean(axis=(0, 2, 3)), y.var(axis=(0, 2, 3)))

        handles.append(conv.register_forward_post_hook(keep))
    was_training = model.training
    model.train()
    try:
        with paddle.no_grad():
            model(paddle.to_tensor(np.ascontiguousarray(images, dtype=np.float32)))
    finally:
        for handle in handles:
            handle.remove()
        model.set_state_dict({k: paddle.to_tensor(v) for k, v in saved.items()})
        if not was_training:
            model.eval()
    return stats


def training_form_state(seed: int = 0, *, calibration_images: np.ndarray | None = None, src=None):
    """``(train_model, state)``: PaddleOCR's ``build_model`` of the student config (``src``: a PaddleOCR tree,
    default :func:`~ampsafe_lab.workloads.ppocrv4.paddleocr_src`) and ``{name: ndarray}`` for every tensor of its
    ``state_dict``, computing in eval mode what the shipped detector computes. Raises if a tensor is left
    without a value or a shipped one unused."""
    import paddle

    from ampsafe_lab.nets.paddle import ppocrv4 as nets

    from . import load_config, paddleocr_src, read_params

    src = src or paddleocr_src()
    if src is None or not (Path(src) / "ppocr" / "modeling" / "architectures").is_dir():
        raise ConfigError(
            f"the training form is PaddleOCR's build_model: {src or 'no tree found'} is not a PaddleOCR source "
            "tree (set PADDLEOCR_SRC or pass src)"
        )
    if calibration_images is not None:
        shape = np.shape(calibration_images)
        if len(shape) != 4 or shape[1] != 3 or shape[2] % 32 or shape[3] % 32:
            raise ConfigError(
                f"calibration_images must be normalized pages (N, 3, H, W), H and W multiples of 32; got {shape}"
            )
    arch = load_config()["Architecture"]
    paddle.seed(seed)  # the threshold branch as the workload seeds it
    shipped = nets.build_with_paddleocr(arch, src)
    nets.load_params(shipped, read_params(), rename=nets.paddleocr_name)
    source = {k: v.numpy() for k, v in shipped.state_dict().items()}
    paddle.seed(seed)
    train = nets.build_with_paddleocr(arch, src, reparameterize=False)
    state = {k: v.numpy().copy() for k, v in train.state_dict().items()}
    reps = rep_layers(train)
    stats = _calibrate(shipped, list(reps), calibration_images) if calibration_images is not None else {}
    filled, used = set(), set()

    def put(name: str, value) -> None:
        value = np.asarray(value, dtype=state[name].dtype)
        if value.shape != state[name].shape:
            raise ValueError(f"{name}: {value.shape} for a model tensor of shape {state[name].shape}")
        state[name] = value
        filled.add(name)

    for name, layer in reps.items():
        kernel, bias = source[f"{name}.reparam_conv.weight"], source[f"{name}.reparam_conv.bias"]
        used.update({f"{name}.reparam_conv.weight", f"{name}.reparam_conv.bias"})
        eps = float(layer.conv_kxk[0].bn._epsilon)
        mean, var = stats.get(name, (np.zeros_like(bias), np.full_like(bias, 1.0 - eps)))
        carrier = f"{name}.conv_kxk.0"
        put(f"{carrier}.conv.weight", kernel)
        put(f"{carrier}.bn._mean", mean)
        put(f"{carrier}.bn._variance", var)
        put(f"{carrier}.bn.weight", np.sqrt(var + eps) if name in stats else np.ones_like(bias))
        put(f"{carrier}.bn.bias", bias + mean)
        silent = [f"{name}.conv_kxk.{i}" for i in range(1, len(layer.conv_kxk))]
        silent += [f"{name}.conv_1x1"] if layer.conv_1x1 is not None else []
        for branch in silent:  # adds exactly 0; the conv keeps its seeded init
            put(f"{branch}.conv.weight", state[f"{branch}.conv.weight"])
            bn = f"{branch}.bn"
            for key, value in (("weight", 0.0), ("bias", 0.0), ("_mean", 0.0), ("_variance", 1.0)):
                put(f"{bn}.{key}", np.full_like(state[f"{bn}.{key}"], value))
        if layer.identity is not None:
            for key, value in (("weight", 0.0), ("bias", 0.0), ("_mean", 0.0), ("_variance", 1.0)):
                put(f"{name}.identity.{key}", np.full_like(state[f"{name}.identity.{key}"], value))
        if layer.stride == 2:  # built, never called by the forward at stride 2
            put(f"{name}.act.lab.scale", np.ones(1))
            put(f"{name}.act.lab.bias", np.zeros(1))
    for name in state:
        if name not in filled and name in source:
            put(name, source[name])
            used.add(name)
    unfilled, unused = sorted(set(state) - filled), sorted(set(source) - used)
    if unfilled or unused:
        raise ValueError(f"training form incomplete: no value for {unfilled[:5]}, shipped tensors unused {unused[:5]}")
    return train, state


def write_training_params(
    path: str | Path, seed: int = 0, *, calibration_images: np.ndarray | None = None, src=None
) -> Path:
    """Write :func:`training_form_state`'s tensors as a PaddleOCR ``.pdparams`` (``paddle.save`` of the training
    model's ``state_dict``, the format ``Global.pretrained_model`` loads); returns the path, ``.pdparams`` added
    when missing."""
    import paddle

    path = Path(path)
    if path.suffix != ".pdparams":
        path = path.with_name(path.name + ".pdparams")
    train, state = training_form_state(seed, calibration_images=calibration_images, src=src)
    train.set_state_dict({k: paddle.to_tensor(v) for k, v in state.items()})
    path.parent.mkdir(parents=True, exist_ok=True)
    paddle.save(train.state_dict(), str(path))
    return path
