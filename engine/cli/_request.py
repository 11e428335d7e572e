"""Options shared by the commands that sample (``generate``, ``compare``): the request and the backend."""

from __future__ import annotations

import argparse

from engine.errors import InvalidRequest

# engine.models.spec.SAMPLERS, written out: importing engine.models here would slow every command's start-up.
SAMPLERS = ("ddpm", "ddim", "pndm", "rflow")


def _condition(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"condition {name!r}: {value!r} is not a number") from None


def add_request_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="",
        help="model id (see `volsynth models`) or model/bundle folder; default: the shipped demo model",
    )
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    parser.add_argument(
        "--sampler",
        default=None,  # no empty choice: argparse would list it in --help as "{,ddpm,...}"
        choices=SAMPLERS,
        help="sampler (default: the model's)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument(
        "--cond",
        action="append",
        type=_condition,
        default=[],
        metavar="NAME=VALUE",
        help="conditioning value in the model's units; repeat for several",
    )
    parser.add_argument(
        "--guidance",
        type=float,
        default=None,
        help="classifier-free guidance scale (default: the model's; 1 = plain conditional)",
    )
    parser.add_argument("--batch", type=int, default=1, help="number of volumes (default 1)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, mps or auto (default)")


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--server",
        default="",
        help="run on a VolSynth engine server (URL from `volsynth serve`) instead of this machine",
    )
    parser.add_argument(
        "--token", default=None, help="the engine server's token (default $VOLSYNTH_SERVER_TOKEN)"
    )
    parser.add_argument(
        "--server-fingerprint",
        default=None,
        metavar="SHA256",
        help="pin the https server's certificate: the fingerprint `volsynth serve --tls-self-signed` "
        "printed (default $VOLSYNTH_SERVER_FINGERPRINT)",
    )


def request_from_args(args: argparse.Namespace, optimization=None):
    """The ``SamplingRequest`` the request options describe (bad values raise ``InvalidRequest``)."""
    from engine.api import SamplingRequest
    from engine.optimization_config import OptimizationConfig

    names = [name for name, _ in args.cond]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise InvalidRequest(f"condition(s) given twice: {', '.join(sorted(duplicates))}")
    if args.steps is not None and args.steps < 1:
        raise InvalidRequest(f"--steps must be at least 1, got {args.steps}")
    return SamplingRequest(
        model=args.model,
        sampler=args.sampler or "",
        steps=args.steps or 0,
        seed=args.seed,
        conditioning=dict(args.cond),
        guidance_scale=args.guidance,
        batch_size=args.batch,
        optimization=optimization or OptimizationConfig(),
    )


def backend_from_args(args: argparse.Namespace):
    """A remote backend for ``--server``, else the local one on ``--device``."""
    if args.server:
        import os

        from engine.backends.remote import RemoteBackend

        return RemoteBackend(
            args.server,
            token=args.token or os.environ.get("VOLSYNTH_SERVER_TOKEN"),
            fingerprint=args.server_fingerprint or os.environ.get("VOLSYNTH_SERVER_FINGERPRINT"),
        )
    from engine.backends.local import LocalBackend

    return LocalBackend(device=args.device)
