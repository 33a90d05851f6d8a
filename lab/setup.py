"""ampsafe-lab: the reference workloads, their brinks and networks, and the demo that ampsafe is measured on.

The library is ``ampsafe`` (the repository root's setup.py); the lab imports it and registers ``ampsafe demo``,
``ampsafe bench`` and the workloads ``ampsafe scan WORKLOAD`` builds in the entry-point group ``ampsafe.lab``.
In a checkout: ``pip install -e .`` then ``pip install -e lab`` (what ``make venv`` runs).
"""

from setuptools import find_packages, setup

setup(
    name="ampsafe-lab",
    version="0.1.0",
    description="ampsafe's lab: reference AMP workloads (DBNet, PP-YOLO, Faster R-CNN, T5, PP-OCRv4), the demo",
    python_requires=">=3.9",
    packages=find_packages(include=["ampsafe_lab", "ampsafe_lab.*"]),
    # Byte-identical copies of the upstream configs the workloads build from by default (the demo's det_mv3_db.yml,
    # ppyolo's named configs); ampsafe_lab/workloads/data/upstream/SOURCES.md lists where each came from.
    package_data={"ampsafe_lab.workloads": ["data/upstream/SOURCES.md", "data/upstream/**/*.yml"]},
    install_requires=["ampsafe==0.1.0", "numpy", "pyyaml"],
    extras_require={
        "torch": ["ampsafe[torch]==0.1.0"],
        "hf": ["ampsafe[hf]==0.1.0"],  # the t5 and llama workloads
        "det": ["ampsafe[det]==0.1.0"],  # the ppyolo workload (ppdet itself goes in with --no-deps)
        "ppocrv4": ["ampsafe[ppocrv4]==0.1.0"],  # the ppocrv4_det workload
        "bench": ["ampsafe[bench]==0.1.0"],
    },
    entry_points={
        "ampsafe.lab": [
            "demo = ampsafe_lab.demo:main",
            "bench = ampsafe_lab.benchcmd:main",
            "workloads = ampsafe_lab.workloads:build",
        ]
    },
)
