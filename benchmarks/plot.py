"""Plots a benchmarks/bench.py JSON: training and inference images/s and peak
memory against batch size and against resolution.

    python benchmarks/plot.py results.json out.png

One line per contender and model (against batch) or per contender, variant
and batch (against resolution); a contender measured at one point only is a
single marker.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List, Tuple

# (section, x, y, title): the panels, in a 2 x 3 grid
PANELS = (
    ("inference", "batch", "images_per_s", "inference images/s vs batch"),
    ("training", "batch", "images_per_s", "training images/s vs batch"),
    ("memory", "batch", "peak_rss_mib", "peak RSS MiB vs batch"),
    ("inference", "image_size", "images_per_s", "inference images/s vs resolution"),
    ("training", "image_size", "images_per_s", "training images/s vs resolution"),
    ("memory", "image_size", "peak_rss_mib", "peak RSS MiB vs resolution"),
)


def series(rows: List[dict], x: str, y: str) -> Dict[str, List[Tuple[float, float]]]:
    """{line name: [(x, y), ...] sorted by x}. Against batch a line is one
    contender on one model (variant@size); against resolution, one contender
    on one variant at one batch."""
    lines: Dict[str, List[Tuple[float, float]]] = {}
    for row in rows:
        if row.get(y) is None:
            continue
        mode = f"{row['mode']} " if "mode" in row else ""
        if x == "batch":
            name = f"{mode}{row['variant']}@{row['image_size']} {row['label']}"
        else:
            name = f"{mode}{row['variant']} batch {row['batch']} {row['label']}"
        lines.setdefault(name, []).append((row[x], row[y]))
    return {name: sorted(points) for name, points in sorted(lines.items())}


def plot(report: dict, path: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 3, figsize=(21, 11))
    for ax, (section, x, y, title) in zip(axes.flat, PANELS):
        lines = series(report.get(section, []), x, y)
        for name, points in lines.items():
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        ax.set_title(title)
        ax.set_xlabel("batch" if x == "batch" else "image size (pixels)")
        if x == "batch" and lines:
            ax.set_xscale("log", base=2)
        if not lines:
            ax.text(0.5, 0.5, f"no {section} rows", ha="center", va="center", transform=ax.transAxes)
        elif len(lines) <= 16:
            ax.legend(fontsize=6)
        ax.grid(True, alpha=0.3)
    machine = report.get("machine", {})
    figure.suptitle(f"keras-vit bench: {machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, "
                    f"GPU: {machine.get('gpu', '?')}")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python benchmarks/plot.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="the JSON benchmarks/bench.py wrote (--output)")
    parser.add_argument("output", help="the PNG to write")
    args = parser.parse_args(argv)
    try:
        with open(args.results) as f:
            report = json.load(f)
    except (OSError, ValueError) as error:
        print(f"plot: error: cannot read {args.results} as bench JSON ({error}); write one with "
              f"python benchmarks/bench.py --output {args.results}", file=sys.stderr)
        return 2
    plot(report, args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
