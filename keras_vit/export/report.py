"""Thresholds an artifact must meet, and the validation table."""

from __future__ import annotations

from typing import Dict, List

from keras_vit.export.registry import REGISTRY

# Per format (declared with it, keras_vit.export.format.ExportFormat.thresholds):
# max_abs_diff on probabilities, min top-1 agreement with Keras, max top-1
# accuracy drop (fraction) where labels exist. None: not checked.
THRESHOLDS: Dict[str, Dict[str, float]] = {name: dict(fmt.thresholds) for name, fmt in REGISTRY.items()}


def failures(row: Dict, thresholds: Dict[str, float]) -> List[str]:
    """Why `row` (a validated artifact) misses its thresholds; empty when it passes."""
    out = []
    limit = thresholds.get("max_abs_diff")
    if limit is not None and not row["max_abs_diff"] <= limit:
        out.append(f"max abs diff {row['max_abs_diff']:.2e} > {limit:.0e}")
    limit = thresholds.get("min_agreement")
    if limit is not None and not row["top1_agreement"] >= limit:
        out.append(f"top-1 agreement {row['top1_agreement']:.2%} < {limit:.0%}")
    limit = thresholds.get("max_accuracy_drop")
    if limit is not None and row.get("accuracy_drop") is not None and not row["accuracy_drop"] <= limit + 1e-12:
        out.append(f"accuracy drop {100 * row['accuracy_drop']:.2f} points > {100 * limit:.1f}")
    return out


def only_agreement_failed(row: Dict, thresholds: Dict[str, float]) -> bool:
    """Whether `row` failed on its top-1 agreement alone: near-ties flipped, while its
    accuracy (where labels exist) and everything else are within their thresholds."""
    agreement = failures(row, {"min_agreement": thresholds.get("min_agreement")})
    return bool(agreement) and list(row.get("failures") or []) == agreement


def _size(n):
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def format_table(report: Dict) -> str:
    """The report as a fixed-width table, one row per artifact (Keras first)."""
    header = ("format", "size", "max |diff|", "top-1 agree", "accuracy", "latency ms", "status")
    keras_row = report["keras"]
    rows = [("keras", _size(keras_row.get("size_bytes")), "-", "-", _fmt(keras_row.get("accuracy"), ".2%"),
             _fmt(keras_row.get("latency_ms"), ".2f"), "reference")]
    for a in report["artifacts"]:
        status = "ok" if a["passed"] else "FAILED: " + "; ".join(a["failures"])
        rows.append((a["format"], _size(a.get("size_bytes")), _fmt(a.get("max_abs_diff"), ".1e"),
                     _fmt(a.get("top1_agreement"), ".2%"), _fmt(a.get("accuracy"), ".2%"),
                     _fmt(a.get("latency_ms"), ".2f"), status))
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    v = report["validation"]
    title = (f"{report['model']['name']}: validated on {v['num_images']} images ({v['source']}), "
             f"latency = median of single-image calls, 1 thread")
    lines = [title, line(header), line(["-" * w for w in widths])] + [line(r) for r in rows]
    where = report.get("report_path") or f"not installed (the export already in {report.get('out')} is kept)"
    lines.append(f"export {'passed' if report['passed'] else 'FAILED'}; report: {where}")
    return "\n".join(lines)


def print_table(report: Dict) -> None:
    """Prints the report `export` returned as the table `keras-vit export` shows."""
    print(format_table(report))
