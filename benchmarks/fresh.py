"""What the one-configuration-per-process benchmarks (lora.py, quantize.py) share: running a
configuration in a fresh process, its memory, and the machine's name for the results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def run_child(script: str, spec: dict) -> dict:
    """`python script --child SPEC` in a fresh process -> the dict it printed as "RESULT {...}"."""
    out = subprocess.run([sys.executable, script, "--child", json.dumps(spec)], capture_output=True, text=True,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode or not lines:
        raise SystemExit(f"configuration {spec} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def status_mib(field: str) -> float:
    """VmRSS (now) or VmHWM (peak) of this process, MiB. Not getrusage's ru_maxrss: it survives
    exec, so a child started by a parent that built a big model begins at the parent's peak."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def machine() -> dict:
    """The CPU's name, the cores and today's date, for a results file."""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = "unknown CPU"
    return {"cpu": cpu, "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d")}


def write_report(out: str, report: dict, markdown) -> None:
    """out.json (the report) and out.md (markdown(report)), said in one line."""
    import json

    with open(out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(out + ".md", "w") as f:
        f.write(markdown(report))
    print(f"wrote {out}.json and .md")


def machine_line(report: dict) -> str:
    """The date, CPU and probe of a report, as a results table's first line ends."""
    machine = report["machine"]
    return f"{report['date']}, {machine.get('cpu', '?')} ({machine.get('cores', '?')} cores); matmul probe {report['probe']}"
