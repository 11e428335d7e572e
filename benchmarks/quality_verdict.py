"""Benchmark: the quality verdict in the field's measures on the shipped model, with the time of each part.

    python benchmarks/quality_verdict.py [--seeds 32] [--steps N] [--out DIR] [--recommended SETTING]

Runs ``volsynth quality`` on the shipped demo model: fp32 on two seed sets (the floor: fp32 against fp32 on
other seeds) and three settings on the first set: the damaging one (int8 on every layer of the U-Net and the
decoder), the recommended int8 setting (``--recommended``, default ``int8+sdpa``: int8 U-Net, SDPA attention,
float decoder; ``fastest-here`` takes what ``volsynth tune`` recommends on this machine) and step caching, a full
pass every 6 steps with the forecast (``cache:k6-l1-f``). It writes the report's JSON and PNG to ``--out`` and
prints, last, the machine, its load average before and after, the seconds of each part (generation, anatomy
checks, radiomic features per volume, the other measures) and each setting's verdict with the statistics that
decided it. The kept verdicts go to ``--out``, not the user's cache.

Quiet machines only for numbers that are quoted: the parts' times grow with the load average printed beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

DAMAGING = '{"quantization": "int8", "decoder_quantization": "int8"}'
CACHING = "cache:k6-l1-f"


def _machine() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} logical cores"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical cores"


def _load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=32, help="seeds a set (default 32)")
    parser.add_argument("--steps", type=int, default=0, help="denoising steps (default: the model's, 50)")
    parser.add_argument(
        "--recommended", default="int8+sdpa", help="the recommended int8 setting (default int8+sdpa)"
    )
    parser.add_argument(
        "--out", default="", help="folder for quality.json, quality.png (default: a new temporary one)"
    )
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="quality-verdict-")).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    os.environ["VOLSYNTH_QUALITY_DIR"] = str(out / "kept")
    from engine.cli import main as volsynth

    command = ["quality", "--seeds", str(args.seeds), "--settings", DAMAGING, args.recommended, CACHING]
    command += ["--steps", str(args.steps)] if args.steps else []
    command += ["--json", str(out / "quality.json"), "--png", str(out / "quality.png")]
    load_before = _load()
    started = time.perf_counter()
    code = volsynth(command)
    wall = time.perf_counter() - started
    if code:
        return code
    data = json.loads((out / "quality.json").read_text(encoding="utf-8"))
    timings = data["timings"]
    volumes = int(timings["volumes"])
    print()
    print(f"machine: {_machine()}; load average (1, 5, 15 min) before {load_before}, after {_load()}")
    print(
        f"{args.seeds} seeds x (fp32 twice + 3 settings) = {volumes} volumes; wall {wall:.0f} s ({wall / 60:.1f} min)"
    )
    print(
        f"  generation         {timings['generate_s']:8.1f} s  ({timings['generate_s'] / volumes:.2f} s a volume)"
    )
    print(
        f"  anatomy checks     {timings['anatomy_s']:8.1f} s  ({timings['anatomy_s'] / volumes:.2f} s a volume)"
    )
    print(f"  segmentation       {timings['segment_s']:8.1f} s")
    print(
        f"  radiomic features  {timings['radiomics_s']:8.1f} s  "
        f"({timings['radiomics_s_per_volume']:.2f} s a volume, nyxus, one core)"
    )
    print(f"  all measures       {timings['measure_s']:8.1f} s  (features, MS-SSIM, bootstrap, permutations)")
    print(f"  total              {timings['total_s']:8.1f} s")
    print()
    rows = ([data["noise_check"]] if data.get("noise_check") else []) + list(data["settings"].values())
    for report in rows:
        verdict = "within" if report["within_noise"] else "SHIFTS"
        print(f"{report['label']}: {verdict}; decided by {', '.join(report['decided_by']) or 'nothing'}")
        for measure in report["measures"].values():
            low, high = measure["interval"]
            flag = "  FLAGGED" if measure["flagged"] else ""
            print(
                f"    {measure['name']:24s} {measure['value']:9.3f} [{low:9.3f}, {high:9.3f}]  floor "
                f"{measure['floor']:9.3f}  n={measure['n']}{flag}"
            )
        share = report["reliability"].get("candidate")
        if share:
            print(f"    reliable: {share['passed']}/{share['count']} pass the anatomy check")
    print(f"\nwrote {out / 'quality.json'} and {out / 'quality.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
