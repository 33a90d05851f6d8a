"""The user's model as every layer meets it: looked up through its data-parallel wrappers, called on its inputs.

Why in core: the tracer, the heal, the emulators and the fronts all unwrap a model and call it on
``example_inputs``; written once here, below all of them, no caller needs the framework registry for it.
Pure Python: importing it imports neither torch nor paddle.
"""

from __future__ import annotations

__all__ = ["call", "unwrap"]

# Paddle fleet's meta-parallel wrappers (``fleet.distributed_model``) keep the model as ``._layers`` too
_FLEET = {"ShardingParallel", "TensorParallel", "SegmentParallel"}
_WRAPPERS = {"module": {"DistributedDataParallel", "DataParallel"}, "_layers": {"DataParallel"} | _FLEET}


def unwrap(model):
    """The user's model inside DDP / DataParallel / paddle.DataParallel / fleet wrappers (they keep it as
    ``.module`` in torch and ``._layers`` in Paddle)."""
    while True:
        for attr, wrappers in _WRAPPERS.items():
            inner = getattr(model, attr, None)
            if inner is not None and type(model).__name__ in wrappers:
                model = inner
                break
        else:
            return model


def call(model, example_inputs):
    """``model(*example_inputs)``, or ``model(**example_inputs)`` for a dict, as ``example_inputs`` is defined
    throughout the API."""
    if isinstance(example_inputs, dict):
        return model(**example_inputs)
    return model(*example_inputs)
