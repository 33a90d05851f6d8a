"""The networks the lab's workloads build, one package per framework, each imported only when a workload is built.

- ``paddle``: DBNet assembled from a PaddleOCR ``Architecture`` section (``dbnet``: the part registries,
  ``build_model``, ``build_loss``) from ``backbones`` (MobileNetV3, ResNet_vd), ``heads`` (DBHead) and ``loss``
  (DBLoss), and PaddleOCR's PP-OCRv4 mobile detector (``ppocrv4``). The necks are the library's
  (:mod:`ampsafe.paddle.nets.paddleocr_necks`): ``ampsafe.patches`` swaps them in, so they ship with ``ampsafe``.
- ``torch``: the PP-OCRv4 detector's torch twin, with PaddleOCR's module names.

Nothing is imported here.
"""
