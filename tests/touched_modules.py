"""`make test-fast`'s second half: every module of keras_vit was exercised by the
fast subset, not merely imported (issue #36: a module the fast subset misses is a
defect). Reads coverage.py's JSON report (`--cov-report=json:FILE`).

A module counts as touched when a line inside one of its functions ran; a module
without functions (tables, constants) when it was imported. Usage:
    python tests/touched_modules.py .coverage-fast.json
"""

import ast
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def package_modules():
    """Every keras_vit module file, relative to the checkout."""
    found = []
    for folder, _, files in os.walk(os.path.join(ROOT, "keras_vit")):
        found += [os.path.relpath(os.path.join(folder, f), ROOT) for f in files if f.endswith(".py")]
    return sorted(found)


def has_code(module: str) -> bool:
    """Whether the module holds anything besides a docstring (a package `__init__` that only
    states its purpose has no line coverage could see run)."""
    with open(os.path.join(ROOT, module), encoding="utf-8") as f:
        body = ast.parse(f.read()).body
    docstring = body[:1] and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    return len(body) > (1 if docstring else 0)


def untouched(report: dict) -> list:
    files = {os.path.relpath(os.path.abspath(name), ROOT): data for name, data in report["files"].items()}
    missing = []
    for module in package_modules():
        data = files.get(module)
        if not has_code(module):
            continue
        if data is None or not data["executed_lines"]:
            missing.append(f"{module} (never imported)")
            continue
        functions = {name: f for name, f in data.get("functions", {}).items() if name}
        if functions and not any(f["executed_lines"] for f in functions.values()):
            missing.append(f"{module} (imported, no function ran)")
    return missing


def main(argv):
    with open(argv[1]) as f:
        report = json.load(f)
    missing = untouched(report)
    if missing:
        print("The fast subset (-m 'not slow') does not exercise these keras_vit modules; give each a fast "
              "test, or take the slow marker off one that covers it:\n  " + "\n  ".join(missing))
        return 1
    print(f"The fast subset exercises all {len(package_modules())} keras_vit modules.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
