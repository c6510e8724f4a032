"""Plots benchmarks/bench.py JSON: training and inference images/s and peak
memory against batch size and against resolution, and where the attention's
growing share of the work shows (fraction of the matmul limit against
resolution, beside the attention products' share of the FLOPs).

    python benchmarks/plot.py results.json [more.json ...] out.png

Several JSONs are merged (their rows side by side; the first one's machine
in the title). One line per contender and model (against batch) or per
contender, variant and batch (against resolution); a contender measured at
one point only is a single marker.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List, Tuple

# (section, x, y, title): the panels, in a 2 x 4 grid
PANELS = (
    ("inference", "batch", "images_per_s", "inference images/s vs batch"),
    ("training", "batch", "images_per_s", "training images/s vs batch"),
    ("memory", "batch", "peak_rss_mib", "peak RSS MiB vs batch"),
    ("inference", "image_size", "fraction_of_peak", "inference: fraction of matmul limit vs resolution"),
    ("inference", "image_size", "images_per_s", "inference images/s vs resolution"),
    ("training", "image_size", "images_per_s", "training images/s vs resolution"),
    ("memory", "image_size", "peak_rss_mib", "peak RSS MiB vs resolution"),
    ("training", "image_size", "fraction_of_peak", "training: fraction of matmul limit vs resolution"),
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


def attention_shares(rows: List[dict]) -> Dict[str, List[Tuple[int, float]]]:
    """{variant: [(image size, attention products' share of the FLOPs), ...]}."""
    import os

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_core import attention_share

    sizes: Dict[str, set] = {}
    for row in rows:
        sizes.setdefault(row["variant"], set()).add(row["image_size"])
    return {v: [(s, attention_share(v, s)) for s in sorted(ss)] for v, ss in sorted(sizes.items())}


def merge(reports: List[dict]) -> dict:
    """The rows of several bench JSONs as one report (the first one's machine)."""
    merged = {"machine": reports[0].get("machine", {})}
    for report in reports:
        for section in ("inference", "training", "memory"):
            merged.setdefault(section, []).extend(report.get(section, []))
    return merged


def plot(report: dict, path: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 4, figsize=(28, 11))
    for ax, (section, x, y, title) in zip(axes.flat, PANELS):
        lines = series(report.get(section, []), x, y)
        for name, points in lines.items():
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        if y == "fraction_of_peak" and lines:
            # The work that runs below the matmul limit grows with the tokens squared.
            for variant, points in attention_shares(report.get(section, [])).items():
                ax.plot([p[0] for p in points], [p[1] for p in points], linestyle="--", color="gray",
                        marker="x", label=f"{variant}: attention products' share of FLOPs")
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
    parser.add_argument("results", nargs="+", help="the JSON(s) benchmarks/bench.py wrote (--output)")
    parser.add_argument("output", help="the PNG to write")
    args = parser.parse_args(argv)
    reports = []
    for path in args.results:
        try:
            with open(path) as f:
                reports.append(json.load(f))
        except (OSError, ValueError) as error:
            print(f"plot: error: cannot read {path} as bench JSON ({error}); write one with "
                  f"python benchmarks/bench.py --output {path}", file=sys.stderr)
            return 2
    plot(merge(reports), args.output)
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
