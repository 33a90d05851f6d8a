"""amp health in the logger a trainer already feeds: the same ``amp/*`` names for every trainer and framework.

- :mod:`ampsafe.integrations.metrics`: ``amp_metrics(scaler)``, the names and values every logger gets.
- :mod:`ampsafe.integrations.tensorboard`: ``AmpTensorBoard`` for a plain loop (an event file, no TensorFlow).
- each trainer's logger object, under the name a user imports it by (each is written with everything else
  ampsafe knows about its trainer, in :mod:`ampsafe.hosts`):
  :mod:`ampsafe.integrations.hf` (``AmpCallback`` for HF ``Trainer``: every ``report_to`` logger gets the keys),
  :mod:`ampsafe.integrations.lightning` (``AmpMetricsCallback``, through ``pl_module.log``),
  :mod:`ampsafe.integrations.mmengine` (``AmpSafeHook``, through the runner's ``MessageHub``),
  :mod:`ampsafe.integrations.ultralytics` (``add_callbacks(model)``: the dict its loggers read).

Importing this package or any of its modules imports no framework and no trainer: each reaches its trainer
inside the functions that need it, so ``import ampsafe`` stays light and the modules load with the trainer absent.
"""
