"""An ordinary ppdet-style script (knows nothing about ampsafe): load a config, build its neck by name."""

import argparse

from ppdet.core.workspace import create, load_config
from ppdet.modeling.shape_spec import ShapeSpec

parser = argparse.ArgumentParser()
parser.add_argument("-c", "--config", required=True)
args = parser.parse_args()

cfg = load_config(args.config)
neck_name = cfg[cfg.architecture]["neck"]
neck = create(
    neck_name, input_shape=[ShapeSpec(channels=c, stride=s) for c, s in ((256, 4), (512, 8), (1024, 16), (2048, 32))]
)
print(f"script: built {neck_name} as {type(neck).__module__}.{type(neck).__name__}", flush=True)
