"""Benchmark keras-vit against keras-hub's ViT and HF transformers' PyTorch ViT.

Run by hand (not part of the test suite), e.g.

    python benchmarks/bench.py --quick --output benchmarks/results.json
    python benchmarks/bench.py                     # the full matrix: hours on 2 cores

Same as `keras-vit bench`; the code lives in keras_vit/bench.py, `--help` lists
the options.
"""

import argparse
import sys

from keras_vit import bench

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="benchmarks/bench.py", description=__doc__.split("\n")[0])
    bench.add_arguments(parser)
    sys.exit(bench.run(parser.parse_args()) or 0)
