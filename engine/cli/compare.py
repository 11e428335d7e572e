"""``volsynth compare``: one request with two optimization settings, side by side (volumes, speed, memory, kernels)."""

from __future__ import annotations

import argparse

from engine.cli._request import (
    add_backend_arguments,
    add_request_arguments,
    backend_from_args,
    request_from_args,
)
from engine.errors import InvalidRequest


def register(sub) -> None:
    parser = sub.add_parser(
        "compare",
        help="compare two optimization settings on the same seed (volumes, speed, memory, kernels)",
        description="Runs the request with settings A, then with settings B (same model, seed, noise and "
        "conditioning) and reports per-step latency, decode time, peak memory, the top operators of a few "
        "profiled steps, and how far B's volume moved from A's (PSNR, SSIM, max/mean |B-A|). The first "
        "line after the table is the part B's settings change (U-Net step, decode, or end to end) with the "
        "verdict of the noise rule (engine.metrics.speed_verdict): faster or slower only when the rule says so. "
        "Writes a.nii.gz, b.nii.gz (with sidecars), difference.nii.gz (B-A) and compare.json to "
        "--out. A setting is a name (`volsynth bench --rows list`, less 'reference') or a JSON object of "
        'optimization fields, e.g. \'{"autocast": "bf16", "attention": "sdpa"}\'.',
    )
    add_request_arguments(parser)
    parser.add_argument("--a", default="fp32", help="settings A (default fp32)")
    parser.add_argument("--b", required=True, help="settings B")
    parser.add_argument(
        "--profile-steps",
        type=int,
        default=2,
        help="denoising steps to kernel-profile in each run (default 2; 0 = none)",
    )
    parser.add_argument(
        "--allow-slower",
        action="store_true",
        help="measure settings expected to be slower than fp32 on this machine instead of refusing them",
    )
    add_backend_arguments(parser)
    parser.add_argument("--out", required=True, help="output folder")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses
    import sys
    from pathlib import Path

    from engine.api import drive
    from engine.cli._progress import ProgressLine
    from engine.cli._settings import parse_settings, print_prediction
    from engine.compare import compare_settings, save_comparison
    from engine.nifti.io import check_output_path

    label_a, config_a = parse_settings(args.a)
    label_b, config_b = parse_settings(args.b)
    if args.allow_slower:
        config_a = dataclasses.replace(config_a, allow_slower=True)
        config_b = dataclasses.replace(config_b, allow_slower=True)
    if label_a == label_b:
        label_a, label_b = f"A {label_a}", f"B {label_b}"
    from engine.api.request_fields import request_field

    refusal = request_field("kernel_profile_steps").refusal(args.profile_steps)
    if refusal:
        raise InvalidRequest(f"--profile-steps: {refusal}")
    request = request_from_args(args)
    out = Path(args.out).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidRequest(f"cannot create the output folder {out}: {exc.strerror}") from exc
    check_output_path(out / "a.nii.gz")  # a folder we cannot write to fails now, not after two runs

    backend = backend_from_args(args)
    if not args.server:  # before either run: a refused B fails now, not after A has run
        for config in (config_a, config_b):
            print_prediction(request.replace(optimization=config), args.device)
    line = ProgressLine()
    try:
        comparison = drive(
            compare_settings(
                backend,
                request,
                config_a,
                config_b,
                (label_a, label_b),
                kernel_profile_steps=args.profile_steps,
            ),
            on_progress=line.update,
        )
    finally:
        line.close()
    save_comparison(comparison, out)
    print(comparison.format_table())
    for side in (comparison.a, comparison.b):
        profile = side.kernel_profile
        if profile and profile["operators"]:
            print(
                f"\n{side.label}: top operators by {profile['clock']} self time, steps {profile['steps']} "
                f"({profile['total_ms_per_step']:.1f} ms profiled per step)"
            )
            for op in profile["operators"][:8]:
                print(
                    f"  {op['share'] * 100:5.1f} %  {op['self_ms_per_step']:9.2f} ms  x{op['calls_per_step']:<5.0f} "
                    f"{op['name']}"
                )
    print(f"\nwrote {out}/a.nii.gz, b.nii.gz, difference.nii.gz, compare.json", file=sys.stderr)
    return 0
