"""``ampsafe run``: the zero-edit path for unmodified training scripts.

``launcher`` is the parent process (options, the child's ``sitecustomize``, the exit summary and report);
``auto`` is the child side that puts ampsafe's scalers, the FP32 guard (``guard``), the detection target checks
(``targets``) and the emulators in place; ``report`` turns the children's summaries into ``report.md``/``.json``.
Nothing here imports a framework at top level.
"""
