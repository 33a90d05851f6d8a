"""Two small loops in one process (one ``ampsafe run`` for both): ``closure_steps.py`` with this script's
arguments, then ``scaler_reload.py``."""

import runpy
import sys
from pathlib import Path

here = Path(__file__).parent
runpy.run_path(str(here / "closure_steps.py"), run_name="__main__")
sys.argv[1:] = []
runpy.run_path(str(here / "scaler_reload.py"), run_name="__main__")
