"""ampsafe's lab (distribution ``ampsafe-lab``): the reference workloads, their brinks and networks, the demo.

The library (``ampsafe``) finds, scans, fixes and guards any model; the lab holds what the project measures it on:
``workloads`` (``build(name)``: dbnet, ppyolo, frcnn, t5, llama, ppocrv4_det), ``nets`` (the networks they build),
``demo`` (``ampsafe demo``'s training loops, shared with ``bench/``) and ``benchcmd`` (``ampsafe bench``). The lab
imports the library, never the other way: ``ampsafe demo`` and ``ampsafe bench`` reach the lab through the entry
points it registers (group ``ampsafe.lab``, see ``lab/setup.py``).

Nothing is imported here, so ``import ampsafe_lab`` imports no framework.
"""
