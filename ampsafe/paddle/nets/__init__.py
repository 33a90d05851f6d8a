"""Paddle networks this project defines: the ``dbnet`` workload's DBNet and the necks ``ampsafe.patches`` ships.

- ``dbnet``: DBNet assembled from a PaddleOCR ``Architecture`` section (the part registries, ``build_model``,
  ``build_loss``), from ``backbones`` (MobileNetV3, ResNet_vd), ``heads`` (DBHead) and ``loss`` (DBLoss);
- ``paddleocr_necks``: PaddleOCR's DB necks (DBFPN, RSEFPN, LKPAN) and their AMP-safe variants;
- ``ppdet_necks``: PaddleDetection's FPN with a normalization after each conv (imports ``ppdet``).

They live in the Paddle package because they are Paddle code: outside ``ampsafe/torch/`` and ``ampsafe/paddle/``
no module imports a framework when it is imported. The workload (:mod:`ampsafe.workloads.dbnet`) and the patches
(:mod:`ampsafe.patches`) name these classes and import them only when a model is built. Nothing is imported
here, so ``import ampsafe.paddle.nets.paddleocr_necks`` does not pull in ``ppdet``.
"""
