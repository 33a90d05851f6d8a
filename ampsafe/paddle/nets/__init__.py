"""The Paddle networks the library ships: the necks ``ampsafe.patches`` swaps in, and their upstream originals.

- ``paddleocr_necks``: PaddleOCR's DB necks (DBFPN, RSEFPN, LKPAN), their AMP-safe variants and the squeeze-excite
  gate the RSE necks share (the lab's MobileNetV3 reuses it);
- ``ppdet_necks``: PaddleDetection's FPN with a normalization after each conv (imports ``ppdet``);

They live in the Paddle package because they are Paddle code: outside ``ampsafe/torch/`` and ``ampsafe/paddle/``
no module imports a framework when it is imported. The patches (:mod:`ampsafe.patches`) name these classes and
import them only when a model is built. Nothing is imported here, so ``import ampsafe.paddle.nets.paddleocr_necks``
does not pull in ``ppdet``. The networks the reference workloads build (DBNet, its backbones, head and loss, the
PP-OCRv4 detector in both frameworks) are the lab's (``lab/``, distribution ``ampsafe-lab``), which imports these.
"""
