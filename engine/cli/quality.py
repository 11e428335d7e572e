"""``volsynth quality``: the quality cost of optimization settings at cohort level, against a noise floor."""

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
        "quality",
        help="judge settings against fp32 over N seeds: FRD, tissue-volume distance, diversity and reliability "
        "with intervals, the permutation rule, per seed PSNR/SSIM",
        description="Generates fp32 on N seeds (set A) and on N other seeds (set B: the noise floor), and each "
        "setting on set A, then reports per seed PSNR/SSIM against fp32 on the same seed, the GM/WM/CSF volume "
        "distributions (the model's tissue maps, or segmentation for models without them), MS-SSIM diversity "
        "and MMD of offline features, FRD over IBSI radiomic features, the tissue-volume Wasserstein distance "
        "and the share of volumes passing the anatomy check, each with a bootstrap interval against fp32's "
        "seed-to-seed floor, and a verdict per setting naming the statistics that decided it: within seed-to-seed variation, or shifts the "
        "distribution (what moved). A setting is a name (`volsynth bench --rows list`), fastest-here (what "
        "`volsynth tune` recommends here) or a JSON object of optimization fields. Ctrl-C cancels.",
    )
    add_request_arguments(parser)
    parser.add_argument("--seeds", type=int, default=16, help="seeds a set (default 16; at least 4)")
    parser.add_argument(
        "--settings",
        nargs="+",
        required=True,
        metavar="SETTING",
        help="settings to judge against fp32, e.g. --settings fastest-here bf16 cache:k4-l1-f "
        '\'{"quantization": "int8", "decoder_quantization": "int8"}\', or a shorter schedule: steps:25 (fp32 on '
        "25 steps against fp32 on the request's steps)",
    )
    parser.add_argument(
        "--contrast",
        default=None,
        help="contrast segmentation assumes for a model without tissue maps (t1w, t2w, flair; default: "
        "from --modality, else t1w)",
    )
    parser.add_argument(
        "--allow-slower",
        action="store_true",
        help="run settings expected to be slower than fp32 on this machine instead of refusing them",
    )
    add_backend_arguments(parser)
    parser.add_argument("--json", metavar="FILE", help="write the whole report as JSON")
    parser.add_argument("--png", metavar="FILE", help="write the plots as a PNG")
    parser.set_defaults(func=run)


def settings_from_args(texts: list[str], model: str, allow_slower: bool = False) -> dict:
    """label -> ``Candidate`` for ``--settings``: bench row names, fastest-here and JSON objects (settings on the
    request's schedule), ``steps:N`` (fp32 on a schedule of N steps)."""
    import dataclasses

    from engine.api.optimization_config import OptimizationConfig
    from engine.cli._settings import FASTEST_HERE, parse_settings, settings_from_text
    from engine.quality.run import Candidate, schedule_steps

    out: dict[str, Candidate] = {}
    for text in texts:
        steps = schedule_steps(text.strip())
        if steps is not None:
            label, config = text.strip(), OptimizationConfig()
        elif text.strip() == FASTEST_HERE:
            config = settings_from_text(text, model)
            label = f"fastest here ({config.summary()})"
        else:
            label, config = parse_settings(text)
            if text.strip()[:1] == "{":
                label = _json_label(config)
        if allow_slower:
            config = dataclasses.replace(config, allow_slower=True)
        if label in out:
            raise InvalidRequest(f"setting {label!r} is named twice in --settings")
        out[label] = Candidate(config, steps)
    return out


def _json_label(config) -> str:
    """A short name for settings given as JSON, with the decoder's own settings ("int8 + decoder int8")."""
    label = config.summary()
    decoder = [v for v in (config.decoder_autocast, config.decoder_quantization) if v]
    if decoder and "dec:" not in label and "decoder" not in label:
        label += " + decoder " + "+".join(decoder)
    return label


def _check_file(path_text: str | None, suffix: str, flag: str):
    from pathlib import Path

    if not path_text:
        return None
    path = Path(path_text).expanduser()
    if path.suffix.lower() != suffix:
        raise InvalidRequest(f"{flag} needs a {suffix} file name, got {path_text!r}")
    if not path.parent.is_dir():
        raise InvalidRequest(f"{flag}: the folder {path.parent} does not exist")
    return path


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from engine.api import drive
    from engine.cli._progress import ProgressLine
    from engine.cli._settings import print_prediction
    from engine.nifti.io import atomic_files
    from engine.quality.plot import save_png
    from engine.quality.run import quality_run

    if not 4 <= args.seeds <= 64:
        raise InvalidRequest(f"--seeds must be from 4 to 64 (the rule needs 4 a set), got {args.seeds}")
    if args.batch != 1:
        raise InvalidRequest("--batch does not apply: quality generates one volume per seed (use --seeds)")
    json_path = _check_file(args.json, ".json", "--json")
    png_path = _check_file(args.png, ".png", "--png")
    settings = settings_from_args(args.settings, args.model, args.allow_slower)
    request = request_from_args(args)
    backend = backend_from_args(args)
    if not args.server:  # a refused setting fails now, not after the fp32 sets have run
        for candidate in settings.values():
            print_prediction(request.replace(optimization=candidate.config), args.device)
    total = args.seeds * (2 + len(settings))
    print(
        f"quality: {total} volumes ({args.seeds} seeds x fp32 on two seed sets + {len(settings)} setting(s)); "
        "Ctrl-C cancels",
        file=sys.stderr,
    )
    line = ProgressLine()

    def on_progress(progress) -> None:
        # Each volume's load and decode are left off the line: a stage change restarts its rate, so the ETA
        # would only ever see one volume's steps; counted over all volumes it includes their decodes.
        if progress.stage not in ("load", "decode", "compile"):
            line.update(progress)

    try:
        result = drive(
            quality_run(backend, request, settings, args.seeds, contrast=args.contrast),
            on_progress=on_progress,
        )
    finally:
        line.close()
    print(result.format_table())
    if not args.server:  # a server's verdict belongs to its machine, not this one
        from datetime import UTC, datetime

        from engine.machine.probe import probe_machine
        from engine.models.registry import ModelRegistry
        from engine.optimization.tune_store import model_key
        from engine.quality.store import save_run

        key = model_key(ModelRegistry().get(args.model or None).weights_sha256())
        created = datetime.now(UTC).isoformat(timespec="seconds")
        kept = save_run(result, probe_machine().fingerprint(), key, created)
        print(f"kept the verdicts for bench and tune in {kept}", file=sys.stderr)
    if json_path:
        with atomic_files([json_path]) as (temp,):
            temp.write_text(json.dumps(result.to_dict(), indent=2, default=str), encoding="utf-8")
        print(f"wrote {json_path}", file=sys.stderr)
    if png_path:
        with atomic_files([png_path]) as (temp,):
            if not save_png(result, temp):
                raise InvalidRequest("--png needs matplotlib, which is not installed")
        print(f"wrote {png_path}", file=sys.stderr)
    return 0
