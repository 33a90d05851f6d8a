"""``ampsafe run``: the zero-edit path for unmodified training scripts.

``options`` is :class:`~ampsafe.run.options.RunOptions`, the options as one typed value (command line, config,
environment, ``ampsafe.auto.install``); ``launcher`` is the parent process (the child's ``sitecustomize``, the exit
summary and report);
``auto`` is the child side that puts ampsafe's scalers, the FP32 guard (``guard``), the detection target checks
(``targets``) and the emulators in place; ``report`` turns the children's summaries into ``report.md``/``.json``.
Nothing here imports a framework at top level.
"""
