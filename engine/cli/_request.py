"""Options shared by the commands that sample (``generate``, ``compare``, ``quality``): the request, made from the
request field rows (``engine.api.request_fields``), and the backend."""

from __future__ import annotations

import argparse

from engine.errors import InvalidRequest


def _condition(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    try:
        return name.strip(), float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"condition {name!r}: {value!r} is not a number") from None


def add_request_arguments(parser: argparse.ArgumentParser, fields=None) -> None:
    """One flag per request field with a flag (``engine.api.request_fields``, or ``fields``), its help the
    field's: a number, text, one of the field's choices (the sampler registry's names: no empty choice, argparse
    would list it in --help as "{,ddpm,...}"), NAME=VALUE repeated, or XxYxZ. Each flag's value lands under the
    flag's name (``--guidance`` -> ``args.guidance``); ``request_from_args`` reads them back by the same rows.
    Then the options that are not request fields: --preview-size, --device, --xla-topology."""
    from engine.api import request_fields as rules

    groups: dict[str, argparse._ArgumentGroup] = {}
    for row in rules.all_fields() if fields is None else fields:
        if row.flag is None:
            continue
        target = (
            parser if not row.group else groups.setdefault(row.group, parser.add_argument_group(row.group))
        )
        if row.kind == rules.CHOICE:
            target.add_argument(row.flag, default=None, choices=row.values, help=row.cli_help)
        elif row.kind == rules.CONDITIONS:
            target.add_argument(
                row.flag, action="append", type=_condition, default=[], help=row.cli_help, metavar=row.metavar
            )
        elif row.kind in (rules.WHOLE, rules.NUMBER):
            kind = int if row.kind == rules.WHOLE else float
            unset = row.unset is not None or row.optional  # left out: the model's default
            target.add_argument(
                row.flag,
                type=kind,
                default=None if unset else row.default,
                help=row.cli_help,
                metavar=row.metavar,
            )
        else:  # text, or XxYxZ (parsed by request_from_args, which names the flag in its message)
            target.add_argument(row.flag, default=row.default, help=row.cli_help, metavar=row.metavar)
    output = groups.get(rules.request_field("output_size").group) or parser
    output.add_argument(
        "--preview-size",
        action="store_true",
        help="the model's smaller preview size (half the edges at twice the spacing: the same field of view)",
    )
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, mps or auto (default)")
    parser.add_argument(
        "--xla-topology",
        default=None,
        metavar="NAME",
        help="with --device xla here: the slice or box plans are costed against (e.g. v5e:2x4; this host's "
        "devices stand in for it); needed for --xla-plan best off a TPU slice",
    )


def request_fields_from_args(args: argparse.Namespace, fields=None) -> dict:
    """The request fields the flags of :func:`add_request_arguments` give (bad values raise ``InvalidRequest``
    naming the flag): a flag left out is the field's default."""
    from engine.api import request_fields as rules
    from engine.models.output_geometry import parse_triple

    values = {}
    for row in rules.all_fields() if fields is None else fields:
        if row.flag is None:
            continue
        value = getattr(args, row.flag.lstrip("-").replace("-", "_"))
        if row.kind == rules.CONDITIONS:
            names = [name for name, _ in value]
            duplicates = {n for n in names if names.count(n) > 1}
            if duplicates:
                raise InvalidRequest(f"condition(s) given twice: {', '.join(sorted(duplicates))}")
            value = dict(value)
        elif row.kind in (rules.WHOLE_TRIPLE, rules.NUMBER_TRIPLE):
            kind = int if row.kind == rules.WHOLE_TRIPLE else float
            value = parse_triple(value, kind, row.flag) if value else row.default
        elif value is None:
            value = row.unset if row.unset is not None else row.default
        elif row.unset is not None and value == row.unset and row.bounds is not None:
            raise InvalidRequest(
                f"{row.flag} must be at least {row.control_range()[0]:g} (leave it out for the model's default)"
            )
        values[row.name] = value
    return values


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

    fields = request_fields_from_args(args)
    if getattr(args, "preview_size", False):
        if fields["output_size"] or fields["voxel_spacing_mm"]:
            raise InvalidRequest(
                "--preview-size chooses the size and spacing; leave out --size and --spacing"
            )
        fields["output_size"], fields["voxel_spacing_mm"] = _preview_geometry(fields["model"])
    return SamplingRequest(**fields, optimization=optimization or OptimizationConfig())


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

    from engine.backends.factory import connect_server, make_backend

    if args.server:
        wait = getattr(args, "queue_wait", 600.0)
        if not 0 <= wait <= 24 * 3600:
            raise InvalidRequest(f"--queue-wait must be 0 to 86400 seconds, got {wait:g}")
        backend = connect_server(
            args.server,
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
