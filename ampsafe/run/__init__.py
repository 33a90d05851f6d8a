"""``ampsafe run``: the zero-edit path for unmodified training scripts.

``options`` is :class:`~ampsafe.run.options.RunOptions`, the options as one typed value (command line, config,
environment, ``ampsafe.auto.install``); ``launcher`` is the parent process (the child's ``sitecustomize``, the exit
summary and report);
``auto`` is the child side that puts ampsafe's scalers, the FP32 guard (``guard``), the detection target checks
(``targets``) and the emulators in place, each installation a ``session`` (:class:`~ampsafe.run.session.RunSession`);
``records`` are what the child hands the parent; ``report`` turns them into ``report.md``/``.json``.
Nothing here imports a framework at top level.
"""
