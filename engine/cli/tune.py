"""``volsynth tune``: measure which optimization settings pay for a model on this machine, and keep it."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    parser = sub.add_parser(
        "tune",
        help="measure which optimization settings pay for a model on this machine (kept per machine)",
        description="Measures the settings that can apply on this device against fp32, each in its own process, "
        "interleaved, same seed and noise, until the noise rule decides or the time budget is spent; keeps "
        "the result per machine fingerprint, model and library versions (the app's presets read it).",
    )
    parser.add_argument("--model", default="", help="model id or folder (default: the shipped demo model)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    parser.add_argument(
        "--budget", type=float, default=120.0, help="time budget in seconds (default 120; rounds stop there)"
    )
    parser.add_argument("--steps", type=int, default=4, help="steps per measured run, 1 warm-up (default 4)")
    parser.add_argument(
        "--rows",
        default="",
        help="comma-separated rows to measure (default: every candidate); also the step-caching rows "
        "(cache:k4-l1-f ...) and shorter schedules (steps:25: projected from fp32's measured steps), which are "
        "advised only with a quality verdict kept by volsynth quality",
    )
    parser.add_argument(
        "--show", action="store_true", help="print the stored result for this machine, measure nothing"
    )
    parser.add_argument(
        "--estimate",
        action="store_true",
        help="prepare fp32, time one run and print how long the whole measurement would take; measure nothing",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import signal
    import sys
    import threading

    from engine.api import drive
    from engine.errors import InvalidRequest
    from engine.measure.tune import format_result, tune

    if args.show:
        from engine.models.registry import ModelRegistry
        from engine.optimization.tune_store import load_result

        result = load_result(ModelRegistry().get(args.model or None).weights_sha256())
        if result is None:
            raise InvalidRequest("nothing measured for this model on this machine yet: run `volsynth tune`")
        print(json.dumps(result, indent=2, default=str) if args.json else format_result(result))
        return 0
    rows = [r.strip() for r in args.rows.split(",") if r.strip()] or None
    cancel = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: cancel.set())
    job = tune(
        args.model,
        args.device,
        budget_s=args.budget,
        steps=args.steps,
        rows=rows,
        estimate_only=args.estimate,
    )

    def show(progress) -> None:
        print(f"\r[{progress.elapsed_s:5.0f} s] {progress.message:<70s}", end="", file=sys.stderr, flush=True)

    try:
        result = drive(job, on_progress=show, should_stop=cancel.is_set)
    finally:  # drive() has closed the generator: the measuring processes are gone
        signal.signal(signal.SIGINT, previous)
        print(file=sys.stderr)
    if result is None:  # Ctrl-C: tune() always returns a record when it runs to the end
        raise KeyboardInterrupt
    if args.estimate:
        print(
            f"measuring {len(result['rows'])} rows ({', '.join(result['rows'])}) would take about "
            f"{result['estimate_s']:.0f} s here; --budget caps the rounds (at least 3 always run)"
        )
        return 0
    print(json.dumps(result, indent=2, default=str) if args.json else format_result(result))
    print(f"kept in {result['path']}", file=sys.stderr)
    return 0
