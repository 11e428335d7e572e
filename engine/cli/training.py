"""``volsynth train-demo`` and ``volsynth evaluate``: make and check the shipped demo model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_OUT = Path("resources/models/brain-t1-demo")


def register(subparsers) -> None:
    train = subparsers.add_parser(
        "train-demo",
        help="train the shipped brain-T1 latent diffusion model on synthetic MNI152-derived data",
        description="Train the demo model (about 2 hours on an idle 2-core CPU, in parts: each invocation stops "
        "within --minutes-budget and --resume continues). Checkpoints stay in --work.",
    )
    train.add_argument("--out", type=Path, default=DEFAULT_OUT, help="model folder to write")
    train.add_argument("--seed", type=int, default=0, help="seeds data, initialisation and training draws")
    train.add_argument(
        "--work",
        type=Path,
        default=None,
        help="folder for data, checkpoints and the run state, outside the source tree "
        "(default: ~/.cache/volsynth/train-demo; several GB)",
    )
    train.add_argument("--resume", action="store_true", help="continue from the checkpoints in --work")
    train.add_argument("--quick", action="store_true", help="tiny configuration (seconds; for tests)")
    train.add_argument("--ae-steps", type=int, default=None, help="override the autoencoder step count")
    train.add_argument(
        "--unet-steps",
        type=int,
        default=None,
        help="override the U-Net step count (with --resume: extend a finished run)",
    )
    train.add_argument(
        "--minutes-budget",
        type=float,
        default=110.0,
        help="wall-clock budget of this invocation, one part of a run (default 110: parts of at most 2 hours); "
        "the U-Net phase stops early (checkpointed; --resume continues it) when it runs out; 0 = no budget",
    )
    train.add_argument(
        "--decoder-steps", type=int, default=None, help="override the decoder fine-tuning steps"
    )
    train.add_argument(
        "--stop-after",
        choices=("data", "ae", "latents", "decoder", "unet"),
        default=None,
        help="run the phases up to this one, then stop without exporting",
    )
    train.set_defaults(func=_train)

    ev = subparsers.add_parser(
        "evaluate",
        help="evaluate a model: brain-mask Dice, GM/WM contrast, diversity, conditioning; updates its card",
    )
    ev.add_argument("model", nargs="?", default="", help="model id or folder (default: the shipped model)")
    ev.add_argument("--samples", type=int, default=16, help="samples for Dice and contrast")
    ev.add_argument("--steps", type=int, default=50, help="DDIM steps per sample")
    ev.add_argument(
        "--guidance",
        type=float,
        default=None,
        help="classifier-free guidance scale of the evaluation samples (default: the model's; 1 = none)",
    )
    ev.add_argument("--no-card", action="store_true", help="do not rewrite MODEL_CARD.md / evaluation.json")
    ev.add_argument("--no-montage", action="store_true", help="do not write montage.png")
    ev.add_argument(
        "--ablation-work",
        type=Path,
        default=None,
        help="instead of the evaluation: measure the sharpness of each training stage from the checkpoints "
        "in this train-demo --work folder (writes sharpness_ablation.json and, with --baseline, before_after.png)",
    )
    ev.add_argument("--baseline", default="", help="with --ablation-work: the previous model to compare with")
    ev.set_defaults(func=_evaluate)


def _train(args: argparse.Namespace) -> int:
    from engine.training.train import TrainConfig, config_with_steps, train

    if args.work is None:
        from engine.files.user_folders import user_cache_dir

        args.work = user_cache_dir() / "train-demo"
    cfg = TrainConfig.quick() if args.quick else TrainConfig()
    cfg = config_with_steps(cfg, args.ae_steps, args.unet_steps, args.decoder_steps)
    command = "volsynth " + " ".join(sys.argv[1:]) if sys.argv and "volsynth" in sys.argv[0] else ""
    if not command:
        command = (
            f"volsynth train-demo --out {args.out} --seed {args.seed} --work {args.work}"
            + (" --resume" if args.resume else "")
            + (" --quick" if args.quick else "")
        )

    def log(line: str) -> None:
        print(line, flush=True)

    train(
        args.out,
        args.work,
        seed=args.seed,
        resume=args.resume,
        cfg=cfg,
        log=log,
        command=command,
        minutes_budget=args.minutes_budget or None,
        stop_after=args.stop_after,
    )
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from engine.training.evaluate import evaluate_model, sharpness_ablation

    if args.ablation_work is not None:
        sharpness_ablation(
            args.model,
            args.ablation_work,
            args.baseline,
            args.steps,
            log=lambda line: print(line, flush=True),
        )
        return 0

    result = evaluate_model(
        args.model,
        n_samples=args.samples,
        steps=args.steps,
        write_card=not args.no_card,
        write_montage=not args.no_montage,
        guidance_scale=args.guidance,
        log=lambda line: print(line, flush=True),
    )
    return 0 if result["all_pass"] else 1
