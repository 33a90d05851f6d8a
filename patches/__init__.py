"""Ready-made patches for upstream model families (installed as ``ampsafe.patches``): AMP-safe necks for
PaddleOCR and PaddleDetection, their registration, and the config neck swap."""
