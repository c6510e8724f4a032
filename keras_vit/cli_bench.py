"""`keras-vit bench`: a thin entry to benchmarks/bench.py of the source checkout.

The benchmark is not part of the library users import; it lives in
benchmarks/ beside the package and runs from a checkout of the repository.
"""

from __future__ import annotations

import os
import runpy
import sys

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "bench.py")


def add_arguments(parser):
    parser.add_argument("args", nargs="*", help="options of benchmarks/bench.py (see its --help)")


def run(args):
    if not os.path.isfile(BENCH):
        print("keras-vit bench: error: benchmarks/bench.py is not installed with the package; run it from a "
              "clone of the repository: python benchmarks/bench.py --quick", file=sys.stderr)
        return 2
    sys.argv = [BENCH, *args.args]
    runpy.run_path(BENCH, run_name="__main__")
    return 0
