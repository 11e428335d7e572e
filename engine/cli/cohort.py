"""``volsynth cohort``: many synthetic volumes from one spec, on Ray, as a BIDS-derivative dataset.

``run SPEC --out DIR`` starts (or continues) a cohort, ``resume DIR`` finishes what is missing, ``plan SPEC``
prints the items without generating anything, ``report DIR`` draws a summary (PNG or HTML).
"""

from __future__ import annotations

import sys

SPEC_HELP = """\
A cohort spec (TOML or JSON), for example:

  name = "ventricle-sweep"
  model = "brain-t1-demo"
  sampler = "ddim"
  steps = 20
  guidance_scale = 3.0
  seeds = 2                  # a count, or a list [11, 42]
  draws = 5                  # values drawn from the distributions per grid point
  draw_seed = 1234

  [conditioning]
  ventricle_volume = { grid = { start = 20, stop = 80, num = 4 } }
  brain_volume = { distribution = "normal", mean = 1300, sd = 120 }

  [output]
  target = "folder"          # or "vault" with vault = "path"
"""


def register(sub) -> None:
    parser = sub.add_parser(
        "cohort",
        help="generate a cohort of volumes on Ray as a BIDS-derivative dataset",
        description="Generate many volumes from one spec (on a local Ray runtime or a cluster).",
    )
    commands = parser.add_subparsers(dest="cohort_command", metavar="ACTION")
    commands.required = True

    def ray_options(p) -> None:
        p.add_argument(
            "--address",
            default=None,
            help="Ray cluster address (ray://host:10001 or host:6379); default RAY_ADDRESS or a local runtime",
        )
        p.add_argument(
            "--workers", type=int, default=None, help="worker actors (default: one per GPU, else 1)"
        )
        p.add_argument(
            "--threads", type=int, default=None, help="CPU threads per worker (default: CPUs / workers)"
        )
        p.add_argument(
            "--device",
            choices=["auto", "cpu", "cuda", "xla"],
            default="auto",
            help="worker device; xla: one worker per group of XLA devices (TPU chips, or fake host devices)",
        )
        p.add_argument(
            "--xla-plan",
            default=None,
            metavar="PLAN",
            help="with --device xla: each item's plan over its worker's devices, as `volsynth plan` names it "
            "(dp2, d2xh2...) or best; a group is the plan's mesh (default: the plan the cohort first ran "
            "with, else none: one device per worker)",
        )
        p.add_argument(
            "--xla-devices",
            type=int,
            default=None,
            metavar="N",
            help="with --device xla: XLA devices to use in all, split into groups (default: every TPU chip; "
            "on a host without TPUs, one group per worker)",
        )
        p.add_argument("--num-cpus", type=int, default=None, help="CPUs a new local Ray runtime may use")
        p.add_argument(
            "--passphrase-file", metavar="FILE", help="vault passphrase (vault targets; default: prompt)"
        )

    run = commands.add_parser(
        "run",
        help="generate a cohort (continues it if DIR already holds the same cohort)",
        epilog=SPEC_HELP,
        formatter_class=__import__("argparse").RawDescriptionHelpFormatter,
    )
    run.add_argument("spec", help="cohort spec, .toml or .json")
    run.add_argument("--out", required=True, help="output folder (new or empty, or this cohort's folder)")
    ray_options(run)
    run.set_defaults(func=_run)

    resume = commands.add_parser("resume", help="finish a cohort folder: generate only what is missing")
    resume.add_argument("dir", help="the cohort folder")
    ray_options(resume)
    resume.set_defaults(func=_resume)

    plan = commands.add_parser("plan", help="check a spec and list its volumes without generating them")
    plan.add_argument("spec", help="cohort spec, .toml or .json")
    plan.add_argument("--limit", type=int, default=20, help="items to list (default 20)")
    plan.set_defaults(func=_plan)

    report = commands.add_parser("report", help="summary of a cohort: histograms, montage, throughput")
    report.add_argument("dir", help="the cohort folder")
    report.add_argument(
        "--out", default=None, help="report file, .png or .html (default DIR/code/volsynth/report.png)"
    )
    report.add_argument("--montage", type=int, default=12, help="volumes in the montage (default 12)")
    report.set_defaults(func=_report)


def _progress_printer():
    from engine.formatting import format_duration

    def show(p) -> None:
        if p.event in ("submitted",):
            return
        eta = f"  ETA {format_duration(p.eta_s)}" if p.eta_s is not None else ""
        text = (
            f"cohort: {p.done}/{p.total} done, {p.failed} failed, {p.retries} retried  "
            f"{p.rate_per_min:.2f} volumes/min{eta}"
        )
        if p.event == "started":
            text = f"cohort: {p.message}"
        elif p.event in ("retry", "failed"):
            text += f"  ({p.participant}: {p.message})"
        print(text, file=sys.stderr, flush=True)

    return show


def _vault_for(spec, args):
    if spec.target != "vault":
        return None
    from engine.cli.vault import _passphrase
    from engine.vault.store import Vault

    vault = Vault(spec.vault)
    vault.unlock(_passphrase(args.passphrase_file, "Vault passphrase: "))
    return vault


def _execute(spec, root, args) -> int:
    from engine.api import drive
    from engine.cohort.runner import cohort_events

    vault = _vault_for(spec, args)
    try:
        events = cohort_events(
            spec,
            root,
            address=args.address,
            workers=args.workers,
            threads_per_worker=args.threads,
            device=args.device,
            num_cpus=args.num_cpus,
            vault=vault,
            xla_plan=args.xla_plan,
            xla_devices=args.xla_devices,
        )
        summary = drive(events, on_progress=_progress_printer())
    finally:
        if vault is not None:
            vault.lock()
    print(summary.root)
    print(
        f"cohort {summary.cohort_id}: {summary.done}/{summary.total} volumes, {summary.failed} failed, "
        f"{summary.retries} retried; this run {summary.done_this_run} in {summary.elapsed_s:.0f} s "
        f"({summary.volumes_per_min:.2f} volumes/min, {summary.workers} worker(s) x "
        f"{summary.threads_per_worker} thread(s), {summary.device})",
        file=sys.stderr,
    )
    if summary.device == "xla":
        print(f"cohort {summary.cohort_id}: {summary.devices_text()}", file=sys.stderr)
    for error in summary.errors[:5]:
        print(f"volsynth: failed: {error}", file=sys.stderr)
    return 0 if summary.failed == 0 and summary.done == summary.total else 1


def _run(args) -> int:
    from engine.cohort.spec import load_spec

    return _execute(load_spec(args.spec), args.out, args)


def _resume(args) -> int:
    from engine.cohort.runner import load_folder_spec

    return _execute(load_folder_spec(args.dir), args.dir, args)


def _plan(args) -> int:
    from engine.cohort.spec import load_spec
    from engine.models.registry import ModelRegistry

    spec = load_spec(args.spec)
    source = ModelRegistry().get(spec.request.model or None)
    items = spec.expand(source.spec)
    print(f"cohort {spec.cohort_id}: {len(items)} volumes of {source.spec.id}", file=sys.stderr)
    names = [c.name for c in source.spec.conditioning]
    print("\t".join(["participant_id", "seed", *names]))
    for item in items[: max(0, args.limit)]:
        values = [f"{item.conditioning[n]:g}" if n in item.conditioning else "default" for n in names]
        print("\t".join([item.participant, str(item.seed), *values]))
    if len(items) > args.limit:
        print(f"... {len(items) - args.limit} more", file=sys.stderr)
    return 0


def _report(args) -> int:
    from engine.cohort.report import write_report

    path = write_report(args.dir, args.out, montage=args.montage)
    print(path)
    return 0
