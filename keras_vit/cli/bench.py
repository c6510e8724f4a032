"""`keras-vit bench`: a thin entry to benchmarks/bench.py of the source checkout.

The benchmark is not part of the library users import; it lives in
benchmarks/ beside the package and runs from a checkout of the repository.
Its own options are added to the subcommand's parser, so `keras-vit bench
--quick --sections training` is exactly `python benchmarks/bench.py --quick
--sections training`.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

# keras_vit/cli/bench.py -> the checkout: three folders up.
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(CHECKOUT, "benchmarks", "bench.py")


@functools.lru_cache(maxsize=None)
def _load():
    spec = importlib.util.spec_from_file_location("keras_vit_benchmarks_bench", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    spec.loader.exec_module(module)  # imports numpy and the standard library only
    return module


def add_arguments(parser):
    if not os.path.isfile(BENCH):
        print("keras-vit bench: error: benchmarks/bench.py is not installed with the package; run it from a "
              "clone of the repository: python benchmarks/bench.py --quick", file=sys.stderr)
        raise SystemExit(2)
    bench = _load()
    parser.description = bench.__doc__.split("\n\n")[0]
    bench.add_arguments(parser)


def run(args):
    return _load().run(args)
