"""Options shared by the commands that sample (``generate``, ``compare``): the request and the backend."""

from __future__ import annotations

import argparse

from engine.errors import InvalidRequest
from engine.samplers import SAMPLERS  # names only: no numpy, no models at the CLI's start-up


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
    output = parser.add_argument_group("output, for models that let a request choose (NV-Generate-MR-Brain)")
    output.add_argument(
        "--modality",
        default="",
        help="modality by name: t1w, t2w, flair, swi, or the same with -skullstripped (default: the model's)",
    )
    output.add_argument(
        "--size", default=None, metavar="XxYxZ", help="output size in voxels, e.g. 256x256x128"
    )
    output.add_argument(
        "--spacing", default=None, metavar="XxYxZ", help="voxel spacing in mm, e.g. 0.94x0.94x1.36"
    )
    output.add_argument(
        "--preview-size",
        action="store_true",
        help="the model's smaller preview size (half the edges at twice the spacing: the same field of view)",
    )
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, mps or auto (default)")
    parser.add_argument(
        "--xla-plan",
        default="",
        metavar="PLAN",
        help="on an XLA engine server (or --device xla): shard the run over its devices as this plan says: "
        "best (the planner's choice for the server's topology) or a name `volsynth plan` prints, e.g. "
        "dp2, d2xh2, dp2xd2/cut@2 (default: one device)",
    )
    parser.add_argument(
        "--xla-topology",
        default=None,
        metavar="NAME",
        help="with --device xla here: the slice or box plans are costed against (e.g. v5e:2x4; this host's "
        "devices stand in for it); needed for --xla-plan best off a TPU slice",
    )


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
    parser.add_argument(
        "--queue-wait",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="while the server's queue is full, wait as it says (Retry-After) for at most this long in all; "
        "then, in line (its place shown), at most this long for the line to move, else the job is "
        "cancelled (default 600; 0: give up at once on a full queue or a job that cannot start at once)",
    )


def request_from_args(args: argparse.Namespace, optimization=None):
    """The ``SamplingRequest`` the request options describe (bad values raise ``InvalidRequest``)."""
    from engine.api import SamplingRequest
    from engine.api.optimization_config import OptimizationConfig

    names = [name for name, _ in args.cond]
    duplicates = {n for n in names if names.count(n) > 1}
    if duplicates:
        raise InvalidRequest(f"condition(s) given twice: {', '.join(sorted(duplicates))}")
    if args.steps is not None and args.steps < 1:
        raise InvalidRequest(f"--steps must be at least 1, got {args.steps}")
    from engine.models.output_geometry import parse_triple

    size = parse_triple(args.size, int, "--size") if getattr(args, "size", None) else None
    spacing = parse_triple(args.spacing, float, "--spacing") if getattr(args, "spacing", None) else None
    if getattr(args, "preview_size", False):
        if size or spacing:
            raise InvalidRequest(
                "--preview-size chooses the size and spacing; leave out --size and --spacing"
            )
        size, spacing = _preview_geometry(args.model)
    return SamplingRequest(
        model=args.model,
        sampler=args.sampler or "",
        steps=args.steps or 0,
        seed=args.seed,
        conditioning=dict(args.cond),
        guidance_scale=args.guidance,
        batch_size=args.batch,
        optimization=optimization or OptimizationConfig(),
        modality=getattr(args, "modality", "") or "",
        output_size=size,
        voxel_spacing_mm=spacing,
        xla_plan=getattr(args, "xla_plan", "") or "",
    )


def _preview_geometry(model: str):
    """The preview size and spacing the model's spec names (a local model; a server's lists it too)."""
    from engine.models.registry import ModelRegistry

    spec = ModelRegistry().get(model or None).spec
    preview = (spec.geometry or {}).get("preview")
    if not preview:
        raise InvalidRequest(
            f"model {spec.id!r} has one output size; --preview-size is for models that let you choose"
        )
    return tuple(preview["size"]), tuple(preview["spacing_mm"])


def backend_from_args(args: argparse.Namespace):
    """A remote backend for ``--server``, else the one for ``--device`` here (torch, or XLA for xla/tpu)."""
    import os

    from engine.backends.factory import make_backend

    if args.server:
        wait = getattr(args, "queue_wait", 600.0)
        if not 0 <= wait <= 24 * 3600:
            raise InvalidRequest(f"--queue-wait must be 0 to 86400 seconds, got {wait:g}")
        backend = make_backend(
            server=args.server,
            token=args.token or os.environ.get("VOLSYNTH_SERVER_TOKEN"),
            fingerprint=args.server_fingerprint or os.environ.get("VOLSYNTH_SERVER_FINGERPRINT"),
        )
        backend.queue_wait_s = wait
        return backend
    topology = getattr(args, "xla_topology", None)
    if topology:
        from engine.backends.factory import is_xla_device

        if not is_xla_device(args.device):
            raise InvalidRequest("--xla-topology is for --device xla (a server has its own: --server)")
        return make_backend(args.device, xla_topology=topology)
    return make_backend(args.device)
