"""Startup benchmark: launch the app N times and print the time to a usable window and to the 3D view.

Run under a display (``xvfb-run -a .venv/bin/python -m benchmarks.app_startup``). Each launch is a fresh process
running ``python -m app --measure-startup``; the numbers include the interpreter's own start-up.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys


def measure(runs: int = 3) -> dict[str, list[float]]:
    found: dict[str, list[float]] = {"window": [], "3d": []}
    for _ in range(runs):
        done = subprocess.run(
            [sys.executable, "-m", "app", "--measure-startup"], capture_output=True, text=True, timeout=120
        )
        for key, pattern in (
            ("window", r"usable window after ([\d.]+) s"),
            ("3d", r"3D view ready after ([\d.]+) s"),
        ):
            match = re.search(pattern, done.stdout)
            if match:
                found[key].append(float(match.group(1)))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    found = measure(args.runs)
    if not found["window"]:
        print("the app did not report a startup time (is there a display? try xvfb-run)")
        return 1
    for key, label in (("window", "usable window"), ("3d", "3D view ready")):
        values = found[key]
        if values:
            print(
                f"{label:>14}: median {statistics.median(values):.2f} s  (runs: {', '.join(f'{v:.2f}' for v in values)})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
