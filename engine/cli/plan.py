"""``volsynth plan``: rank multi-device plans for one U-Net step of a model on a TPU slice or GPU box."""

from __future__ import annotations

import argparse

from engine.xla.planning import BUNDLE_MODEL, DEFAULT_COMPILE_TOP, DEFAULT_TIME_LIMIT_S


def register(sub) -> None:
    parser = sub.add_parser(
        "plan",
        help="plan data-parallel / spatially sharded execution on a TPU slice or GPU box",
        description="Enumerates data-parallel, spatial (depth/height with halo exchange) and 2-D mesh plans "
        "for one denoising step, prunes them on estimates from the jaxpr, compiles the survivors' distinct "
        "U-Net blocks (or, with --whole-compile, their whole step for the topology) and ranks physical "
        "placements with an alpha-beta model of the interconnect. Nothing runs on an accelerator.",
    )
    parser.add_argument(
        "--model",
        default="",
        help=f"model id or folder, or {BUNDLE_MODEL} (MONAI's brain latent-diffusion bundle U-Net, "
        "latent 3x20x28x20); default: the shipped model",
    )
    parser.add_argument("--batch", type=int, default=1, help="volumes per step (default 1)")
    parser.add_argument(
        "--topology", default="v5e:2x4", help="e.g. v5e:2x4, v5e:4x4, v5p:2x2x2, 8xH100-nvlink"
    )
    cfg = parser.add_mutually_exclusive_group()
    cfg.add_argument(
        "--guidance", dest="cfg", action="store_true", default=True, help="classifier-free guidance (default)"
    )
    cfg.add_argument("--no-cfg", dest="cfg", action="store_false", help="no CFG: the batch is not doubled")
    parser.add_argument(
        "--compile-top",
        type=int,
        default=DEFAULT_COMPILE_TOP,
        help=f"compile this many plans with the best estimates, plus the topology-unaware model's favourite "
        f"when it is not among them (default {DEFAULT_COMPILE_TOP}; a full-size compile for a TPU slice took "
        "10-17 minutes on a 2-core machine; its distinct blocks, the default, seconds each)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=DEFAULT_TIME_LIMIT_S,
        metavar="S",
        help=f"print the best plan so far after S seconds, marked CUT SHORT (default {DEFAULT_TIME_LIMIT_S:g}; "
        "0 ranks on the estimates only); a block's compile under way then finishes into the plan cache "
        "before the command exits (Ctrl+C skips it)",
    )
    parser.add_argument(
        "--no-time-limit", action="store_true", help="compile every survivor, however long it takes"
    )
    parser.add_argument(
        "--whole-compile",
        action="store_true",
        help="compile each surviving plan's whole step for the topology (the slow reference: 10-17 minutes "
        "per full-size plan on a 2-core machine) instead of its distinct U-Net blocks on host devices",
    )
    parser.add_argument(
        "--host-whole",
        action="store_true",
        help="compile each surviving plan's whole step on host devices (XLA's SPMD partitioning of the "
        "whole program, about 25 s per full-size plan on 2 cores) instead of its blocks",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="neither read nor keep finished plans and compiled blocks in the plan cache "
        "(~/.cache/volsynth/plans; VOLSYNTH_PLAN_CACHE=0 turns it off everywhere)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from engine.xla.plan_report import format_table
    from engine.xla.planning import plan_model

    progress = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    result = plan_model(
        args.model,
        args.topology,
        batch=args.batch,
        cfg=args.cfg,
        compile_top=args.compile_top,
        progress=progress,
        time_limit_s=None if args.no_time_limit else args.time_limit,
        whole_compile=args.whole_compile,
        use_cache=not args.no_cache,
        analysis="host-whole" if args.host_whole else None,
    )
    print(json.dumps(result.to_dict(), indent=1) if args.json else format_table(result), flush=True)
    _finish_compiles_under_way()
    return 0


def _finish_compiles_under_way() -> None:
    """A compile the time limit stopped waiting for finishes into the plan cache before the command exits,
    so planning again continues from it (a block that takes longer than the limit would otherwise never be
    compiled); Ctrl+C skips it."""
    import sys

    from engine.xla.bounded_compile import finish_in_flight, in_flight

    if not in_flight():
        return
    print(
        "finishing the compile that was under way at the limit, into the plan cache, so planning again "
        "continues from it (Ctrl+C skips it) ...",
        file=sys.stderr,
        flush=True,
    )
    try:
        finish_in_flight()
    except KeyboardInterrupt:
        print("skipped: planning again compiles that block anew", file=sys.stderr)
