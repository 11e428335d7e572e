"""``volsynth plan``: rank multi-device plans for one U-Net step of a model on a TPU slice or GPU box."""

from __future__ import annotations

import argparse

BUNDLE_MODEL = "brain-ldm-bundle"


def register(sub) -> None:
    parser = sub.add_parser(
        "plan",
        help="plan data-parallel / spatially sharded execution on a TPU slice or GPU box",
        description="Enumerates data-parallel, spatial (depth/height with halo exchange) and 2-D mesh plans "
        "for one denoising step, prunes them on estimates from the jaxpr, compiles the survivors for the "
        "topology (compile-only TPU devices from libtpu; host devices for GPU boxes) and ranks physical "
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
        default=3,
        help="compile this many plans with the best estimates (default 3; each full-size compile takes "
        "tens of seconds)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)


def _network(model: str, batch: int, cfg: bool):
    from engine.xla.planner import network_from_definition

    if model == BUNDLE_MODEL:
        from engine.bench.models import bundle_sized_spec

        spec = bundle_sized_spec()
        name = BUNDLE_MODEL
    else:
        from engine.models.registry import ModelRegistry

        spec = ModelRegistry().get(model or None).spec
        name = spec.id
    if spec.latent_shape is None and spec.kind == "latent":
        from engine.errors import ModelInvalid

        raise ModelInvalid(f"model {name} has no latent shape")
    shape = spec.latent_shape if spec.latent_shape is not None else spec.output_shape
    return network_from_definition(name, spec.networks["unet"], tuple(shape)[1:], batch=batch, cfg=cfg)


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from engine.errors import InvalidRequest
    from engine.xla.topology import UnknownTopology, parse_topology

    if args.batch < 1:
        raise InvalidRequest("--batch must be at least 1")
    if args.compile_top < 1:
        raise InvalidRequest("--compile-top must be at least 1")
    try:
        topology = parse_topology(args.topology)
    except UnknownTopology as exc:
        raise InvalidRequest(str(exc)) from None

    # Fake host devices for GPU boxes; must happen before JAX's CPU backend starts.
    from engine.xla.runtime import configure_jax

    configure_jax(max(8, topology.n_devices))
    from engine.xla.planner import format_table, plan

    network = _network(args.model, args.batch, args.cfg)
    progress = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        result = plan(network, topology, compile_top=args.compile_top, progress=progress)
    except UnknownTopology as exc:
        raise InvalidRequest(str(exc)) from None
    if args.json:
        print(json.dumps(result.to_dict(), indent=1))
    else:
        print(format_table(result))
    return 0
