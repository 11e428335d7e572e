"""What the app costs beyond its engine: the app's default generation against the engine's own, interleaved.

Run under a display (``xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python -m benchmarks.app_overhead``;
without one it starts Xvfb itself through ``xvfb-run``). Each repeat runs, one after the other, each in a
fresh process:

* ``app``: ``python -m app --demo``, the window's Generate with its defaults (the shipped model), as a user's
  click; its "Done in" is the engine's ``timings.total_s`` measured inside the app's process;
* ``engine``: ``volsynth generate`` with the same model, seed, sampler, steps, guidance and conditioning (the
  CLI makes no previews);
* ``engine+previews``: the app's exact request (its preview interval too) through the engine's API in a
  plain process: the previews' own cost, apart from what the window adds.

All three share one set of fresh user folders (settings, data, cache), made for the benchmark. It prints the
machine, the load before and after, each arm's median and spread (min-max) of ``total_s``, the ratios of the
medians, what the previews cost (ms each, % of the run) and the app's busiest threads during its run.
Timings on a machine others use are rough: compare the ratios measured here, in one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

_ENGINE_WITH_PREVIEWS = """
import json, sys
from engine.api import SamplingRequest, run
from engine.backends import make_backend
request = SamplingRequest.from_dict(json.loads(sys.argv[1]))
previews = []
result = run(make_backend("auto").sample(request), lambda p: p.preview is not None and previews.append(p.step))
print("engine-run " + json.dumps({"timings": result.provenance["timings"], "preview_steps": previews,
      "step_times_s": result.provenance.get("step_times_s", [])}))
"""


def _machine() -> str:
    try:
        lines = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return "unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("Model name")), "?")
    return f"{model}, {os.cpu_count()} logical cores"


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load unknown"


def _tagged(stdout: str, tag: str) -> dict | None:
    for line in stdout.splitlines():
        if line.startswith(tag):
            return json.loads(line[len(tag) :])
    return None


def run_app(env: dict, folder: Path, timeout: float, tree: Path | None = None) -> dict:
    """The app's demo: this checkout's, or ``tree``'s (another checkout of the app, e.g. a release)."""
    command = [sys.executable, "-m", "app", "--demo", str(folder / "demo.png")]
    if not env.get("DISPLAY") and shutil.which("xvfb-run"):
        command = ["xvfb-run", "-a", "-s", "-screen 0 1600x1000x24", *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=tree)
    run = _tagged(done.stdout, "demo: run ")
    if run is None:
        raise RuntimeError(f"the app's demo reported no run (exit {done.returncode}): {done.stderr[-400:]}")
    return run


def run_engine(env: dict, folder: Path, request: dict, timeout: float) -> dict:
    """``volsynth generate`` with the request's model, seed, sampler, steps, guidance and conditioning."""
    out = folder / "engine.nii.gz"
    command = [
        sys.executable,
        "-c",
        "import sys; from engine.cli import main; sys.exit(main())",
        "generate",
        "--model",
        request["model"],
        "--seed",
        str(request["seed"]),
        "--sampler",
        request["sampler"],
        "--steps",
        str(request["steps"]),
        "--guidance",
        str(request["guidance_scale"]),
        *[arg for name, value in request["conditioning"].items() for arg in ("--cond", f"{name}={value}")],
        "--out",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"volsynth generate failed: {done.stderr[-400:]}")
    sidecar = json.loads(out.with_name("engine.json").read_text())
    return {
        "timings": sidecar["timings"],
        "preview_steps": [],
        "step_times_s": sidecar.get("step_times_s", []),
    }


def run_engine_with_previews(env: dict, request: dict, timeout: float) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _ENGINE_WITH_PREVIEWS, json.dumps(request)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    run = _tagged(done.stdout, "engine-run ")
    if run is None:
        raise RuntimeError(f"the engine's run failed: {done.stderr[-400:]}")
    return run


def _spread(values: list[float]) -> str:
    return f"median {statistics.median(values):6.2f} s  (min-max {min(values):.2f}-{max(values):.2f}, n={len(values)})"


def _preview_cost_s(run: dict) -> float:
    """Seconds the run's previews added: their steps' time beyond the median of the steps without one."""
    steps, previews = run["step_times_s"], set(run["preview_steps"])
    plain = [t for i, t in enumerate(steps, start=1) if i not in previews]
    if not steps or not previews or not plain:
        return 0.0
    typical = statistics.median(plain)
    return sum(max(0.0, steps[i - 1] - typical) for i in previews if i <= len(steps))


def measure(repeats: int, timeout: float, baseline: Path | None = None) -> dict:
    home = Path(tempfile.mkdtemp(prefix="volsynth-overhead-"))
    env = dict(os.environ)
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME"):
        env[name] = str(home / name.lower())
    env.setdefault("QT_QPA_PLATFORM", "xcb")
    found: dict[str, list[dict]] = {"app": [], "engine": [], "engine+previews": []}
    if baseline is not None:
        found["baseline app"] = []
    try:
        for repeat in range(repeats):
            app = run_app(env, home, timeout)
            found["app"].append(app)
            if baseline is not None:
                found["baseline app"].append(run_app(env, home, timeout, baseline))
            found["engine"].append(run_engine(env, home, app["request"], timeout))
            found["engine+previews"].append(run_engine_with_previews(env, app["request"], timeout))
            print(
                f"repeat {repeat + 1}: "
                + ", ".join(f"{arm} {runs[-1]['timings']['total_s']:.2f} s" for arm, runs in found.items()),
                flush=True,
            )
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return found


def report(found: dict) -> list[str]:
    totals = {arm: [r["timings"]["total_s"] for r in runs] for arm, runs in found.items()}
    median = {arm: statistics.median(values) for arm, values in totals.items()}
    lines = [f"{arm:>16}: {_spread(values)}" for arm, values in totals.items()]
    if "baseline app" in median:
        lines.append(f"ratio baseline app / engine: {median['baseline app'] / median['engine']:.3f}")
    lines.append(
        f"ratio app / engine: {median['app'] / median['engine']:.3f}   "
        f"app / engine+previews: {median['app'] / median['engine+previews']:.3f}   "
        f"engine+previews / engine: {median['engine+previews'] / median['engine']:.3f}"
    )
    request = found["app"][0]["request"]
    for arm in [a for a in ("engine+previews", "app", "baseline app") if a in found]:
        costs = [_preview_cost_s(r) for r in found[arm]]
        counts = [len(r["preview_steps"]) for r in found[arm]]
        interval = found[arm][0].get("request", request)["preview_interval"]
        if sum(counts):
            per = 1000 * sum(costs) / sum(counts)
            share = 100 * statistics.median(
                c / r["timings"]["total_s"] for c, r in zip(costs, found[arm], strict=True)
            )
            lines.append(
                f"previews in {arm}: {statistics.median(counts):g} per run (every {interval} "
                f"steps of {request['steps']}), {per:.0f} ms each beyond a step, {share:.1f}% of the run"
            )
    threads: dict[str, list[float]] = {}
    for run in found["app"]:
        for name, seconds in run.get("threads_cpu_s", {}).items():
            threads.setdefault(name.split(" (")[0], []).append(seconds)
    busiest = sorted(threads.items(), key=lambda item: -sum(item[1]))[:5]
    lines.append(
        "app threads' CPU during its run (median s): "
        + ", ".join(f"{name} {statistics.median(v):.2f}" for name, v in busiest)
    )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run at most")
    parser.add_argument("--json", type=Path, help="also write every run's numbers to this file")
    parser.add_argument(
        "--baseline",
        type=Path,
        help="another checkout of the app whose demo runs interleaved with this one's",
    )
    args = parser.parse_args()
    print(f"machine: {_machine()}")
    print(f"load before: {_uptime()}")
    found = measure(args.repeats, args.timeout, args.baseline)
    print(f"load after:  {_uptime()}")
    for line in report(found):
        print(line)
    if args.json:
        args.json.write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
