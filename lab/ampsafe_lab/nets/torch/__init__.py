"""PyTorch networks this project defines, with the module names of the framework they come from.

- ``ppocrv4``: PaddleOCR's PP-OCRv4 mobile text detector (PPLCNetV3 + RSEFPN + DBHead), re-parameterized as its
  trained weights ship, so that ``head.binarize.conv1`` here is ``head.binarize.conv1`` in PaddleOCR.

Nothing is imported here; the workloads import a network's module when they build it.
"""
