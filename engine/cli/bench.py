"""``volsynth bench``: optimization settings vs fp32 NCDHW on one model, same seed and noise, side by side."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    parser = sub.add_parser(
        "bench",
        help="benchmark optimization settings against fp32 on one model",
        description="Runs fp32 NCDHW, MONAI's reference inferer, each setting and combinations on the same "
        "noise, each row in its own process; prints a table and writes bench.json, bench.csv, "
        "bench.txt and bench.png to --out.",
    )
    parser.add_argument(
        "--model",
        default="",
        help="model id or folder, or synthetic:demo-shaped / "
        "synthetic:bundle-sized (random weights, built once under --out)",
    )
    parser.add_argument("--steps", type=int, default=10, help="denoising steps per run (default 10)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per row, interleaved (default 2)")
    parser.add_argument(
        "--warmup", type=int, default=1, help="steps of each run excluded from latency (default 1)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    parser.add_argument(
        "--rows",
        default="",
        help="comma-separated rows (default: a set for the device); 'list' prints the known rows",
    )
    parser.add_argument(
        "--latent-only",
        action="store_true",
        help="skip the decode and compare final latents (for models whose decode is too slow)",
    )
    parser.add_argument(
        "--decoder-only",
        action="store_true",
        help="benchmark the autoencoder's decoder alone: one seeded latent decoded per row (fp32 full, "
        "streamed, decoder settings); time, peak memory, PSNR/SSIM vs the fp32 full decode",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads per row")
    parser.add_argument("--out", default="bench-results", help="output folder (default ./bench-results)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from engine.errors import InvalidRequest
    from engine.measure.bench import DEFAULT_ROWS, ROWS, SPECIAL_ROWS, BenchSettings, format_table, run_bench

    if args.rows == "list":
        for name, config in ROWS.items():
            print(f"{name:22s} {SPECIAL_ROWS.get(name, config)}")
        return 0
    if args.steps < 2 or args.repeats < 1 or not 0 <= args.warmup < args.steps:
        raise InvalidRequest("need --steps >= 2, --repeats >= 1 and 0 <= --warmup < --steps")
    out = Path(args.out)
    model = args.model
    if args.decoder_only:
        return _run_decoder_only(args, out)
    if model.startswith("synthetic:"):
        from engine.models.reference import SYNTHETIC_MODELS, synthetic_model_folder

        name = model.split(":", 1)[1]
        if name not in SYNTHETIC_MODELS:
            raise InvalidRequest(f"unknown synthetic model {name!r}; choose {', '.join(SYNTHETIC_MODELS)}")
        model = str(synthetic_model_folder(name, out / "models").resolve())
    from engine.machine.devices import resolve_device

    device = resolve_device(args.device)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()] or DEFAULT_ROWS[
        "cuda" if device.type == "cuda" else "cpu"
    ]
    settings = BenchSettings(
        model=model,
        steps=args.steps,
        repeats=args.repeats,
        warmup=args.warmup,
        seed=args.seed,
        device=str(device),
        latent_only=args.latent_only,
        threads=args.threads,
    )
    summary = run_bench(settings, rows, out, log=lambda m: print(m, flush=True))
    print(format_table(summary))
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not installed: no bench.png (pip install matplotlib)")
    print(f"results in {out}/bench.json, bench.csv, bench.txt, bench.png")
    return 0


def _run_decoder_only(args: argparse.Namespace, out) -> int:
    from engine.errors import InvalidRequest
    from engine.machine.devices import resolve_device
    from engine.measure.bench import (
        DEFAULT_DECODER_ROWS,
        BenchSettings,
        format_decoder_table,
        run_decoder_bench,
    )

    model = args.model
    if model.startswith("synthetic:"):
        from engine.models.reference import SYNTHETIC_MODELS

        name = model.split(":", 1)[1]
        if name not in SYNTHETIC_MODELS:
            raise InvalidRequest(f"unknown synthetic model {name!r}; choose {', '.join(SYNTHETIC_MODELS)}")
    if args.repeats < 1:
        raise InvalidRequest("need --repeats >= 1")
    device = resolve_device(args.device)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()] or DEFAULT_DECODER_ROWS
    settings = BenchSettings(
        model=model,
        steps=0,
        repeats=args.repeats,
        warmup=0,
        seed=args.seed,
        device=str(device),
        latent_only=False,
        threads=args.threads,
        decoder_only=True,
    )
    summary = run_decoder_bench(settings, rows, out, log=lambda m: print(m, flush=True))
    print(format_decoder_table(summary))
    print(f"results in {out}/bench.json, bench.txt")
    return 0
