"""amp health in the logger a trainer already feeds: one small module per host, the same ``amp/*`` names in all.

- :mod:`ampsafe.integrations.metrics`: ``amp_metrics(scaler)``, the names and values every module logs.
- :mod:`ampsafe.integrations.hf`: ``AmpCallback`` for HF ``Trainer`` (every ``report_to`` logger gets the keys).
- :mod:`ampsafe.integrations.lightning`: ``AmpMetricsCallback`` for Lightning (through ``pl_module.log``).
- :mod:`ampsafe.integrations.mmengine`: ``AmpSafeHook`` for mmengine (through the runner's ``MessageHub``).
- :mod:`ampsafe.integrations.ultralytics`: ``add_callbacks(model)`` for ultralytics (the dict its loggers read).
- :mod:`ampsafe.integrations.tensorboard`: ``AmpTensorBoard`` for a plain loop (an event file, no TensorFlow).

Importing this package or any of its modules imports no framework and no trainer: each reaches its host
inside the functions that need it, so ``import ampsafe`` stays light and the modules load with the host absent.
"""
