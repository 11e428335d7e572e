"""``volsynth serve``: run the engine server for remote clients."""

from __future__ import annotations

import os
from pathlib import Path

from engine.xla import PRECISIONS

TLS_HELP = """\
Securing a server that faces a network: a token of 32 random bytes (`volsynth serve --new-token`) and
TLS, either --tls-self-signed (a certificate kept in --tls-dir; clients pin the SHA-256 fingerprint
printed at start) or --tls-cert/--tls-key from your certificate authority. Clients refuse to send a token
over plain http:// to another machine."""


def register(sub) -> None:
    parser = sub.add_parser(
        "serve",
        help="run the engine server (remote backend for the app and CLI)",
        description="Run the engine server (remote backend for the app and CLI).",
        epilog=TLS_HELP,
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1, this machine only; a network address such as "
        "0.0.0.0 needs --token and TLS)",
    )
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument(
        "--device",
        default="auto",
        help="cpu, cuda, cuda:N, mps or auto (torch); xla: the networks compiled by XLA, on this machine's "
        "TPU chips (a TPU VM, with the xla extra installed) or its CPU",
    )
    parser.add_argument(
        "--xla-precision",
        default="highest",
        choices=PRECISIONS,
        help="with --device xla: matmul precision. highest (default) is float32; default is one bf16 pass "
        "per matmul on TPUs (faster, less exact). Recorded in every result's provenance.",
    )
    parser.add_argument(
        "--xla-devices",
        type=int,
        default=None,
        metavar="N",
        help="with --device xla: the devices a request's plan (--xla-plan) may shard a run over (default: "
        "all; on a host CPU, N fake devices stand in for a slice's chips: right results, not TPU speed)",
    )
    parser.add_argument(
        "--xla-topology",
        default=None,
        metavar="NAME",
        help="with --device xla: the slice or GPU box plans are costed against, e.g. v5e:2x4 or "
        "8xH100-nvlink (default: the TPU slice this machine has; a host CPU needs it for --xla-plan best)",
    )
    parser.add_argument(
        "--token",
        default=os.environ.get("VOLSYNTH_SERVER_TOKEN"),
        help="require this bearer token (default: $VOLSYNTH_SERVER_TOKEN); at least 32 random bytes "
        "(43 characters) for a network address",
    )
    parser.add_argument(
        "--tokens-file",
        default=None,
        metavar="FILE",
        help="one client per line, 'NAME TOKEN' (# starts a comment): each client sees and cancels only "
        "its own jobs and has its own share of the queue; instead of --token",
    )
    parser.add_argument(
        "--new-token", action="store_true", help="print a new random token (32 bytes) and exit"
    )
    parser.add_argument("--tls-cert", default=None, metavar="PEM", help="serve HTTPS with this certificate")
    parser.add_argument("--tls-key", default=None, metavar="PEM", help="... and this private key")
    parser.add_argument(
        "--tls-self-signed",
        action="store_true",
        help="serve HTTPS with a self-signed certificate (made once, kept in --tls-dir); prints its "
        "fingerprint for clients to pin",
    )
    parser.add_argument(
        "--tls-dir",
        default=None,
        help="where --tls-self-signed keeps its certificate (default: ~/.config/volsynth/server-tls)",
    )
    parser.add_argument(
        "--allow-plain-http",
        action="store_true",
        help="serve a network address without TLS (only behind a proxy that terminates TLS)",
    )
    parser.add_argument(
        "--max-queue", type=int, default=8, help="jobs that may wait to run; more are refused (429)"
    )
    parser.add_argument(
        "--max-queue-per-client",
        type=int,
        default=4,
        help="jobs of one client (token) that may wait to run; its further jobs are refused (429)",
    )
    parser.add_argument(
        "--shutdown-grace",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM/Ctrl-C: queued jobs end at once, a running job may finish within this, then it is "
        "cancelled; every client is told at once (default 30)",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="a connection's TLS handshake, and then each request's headers, must arrive within this; "
        "slower sockets are closed (default 10)",
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    from engine.errors import InvalidRequest
    from engine.server import ServerLimits, check_bind, new_token

    if args.new_token:
        print(new_token())
        return 0
    if args.tls_self_signed and (args.tls_cert or args.tls_key):
        raise InvalidRequest("give either --tls-self-signed or --tls-cert and --tls-key, not both")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise InvalidRequest("--tls-cert and --tls-key go together: give both")
    if args.max_queue < 1:
        raise InvalidRequest(f"--max-queue must be at least 1, got {args.max_queue}")
    if args.max_queue_per_client < 1:
        raise InvalidRequest(f"--max-queue-per-client must be at least 1, got {args.max_queue_per_client}")
    if not 1 <= args.header_timeout <= 600:
        raise InvalidRequest(f"--header-timeout must be 1 to 600 seconds, got {args.header_timeout:g}")
    if not 0 <= args.shutdown_grace <= 3600:
        raise InvalidRequest(f"--shutdown-grace must be 0 to 3600 seconds, got {args.shutdown_grace:g}")
    tokens = client_tokens(args)
    tls = bool(args.tls_self_signed or args.tls_cert)
    for token in tokens.values() if tokens else [None]:
        check_bind(args.host, token, tls, args.allow_plain_http)
    cert, key = tls_files(args)

    from engine.server import create_app
    from engine.server.connections import ConnectionLimits, uvicorn_options, within_file_limit
    from engine.server.serving import files_open, raise_file_limit, serve
    from engine.telemetry import Sampler

    soft, _hard = raise_file_limit()
    connections = ConnectionLimits(header_timeout_s=args.header_timeout)
    if soft:  # keep room under the file limit for token holders' connections and the jobs' files
        opened = files_open()
        connections, spare = within_file_limit(connections, soft, opened)
        print(
            f"open-file limit {soft}: up to {connections.max_connections} connections "
            f"({opened} files open, {spare} kept spare)",
            flush=True,
        )
    limits = ServerLimits(
        connections=connections,
        max_queued_jobs=args.max_queue,
        max_queued_per_client=min(args.max_queue_per_client, args.max_queue),
        shutdown_grace_s=args.shutdown_grace,
    )
    metrics = Sampler()  # the server's own GPU/CPU metrics, for clients' metrics views (GET /metrics)
    metrics.start()
    try:
        app = create_app(serving_backend(args), token=tokens, metrics_source=metrics, limits=limits)
        serve(
            app,
            host=args.host,
            port=args.port,
            log_level="info",
            ssl_certfile=cert,
            ssl_keyfile=key,
            **uvicorn_options(limits.connections),  # idle and slow sockets cannot crowd out requests
        )
    finally:
        metrics.stop()
    return 0


def client_tokens(args) -> dict[str, str] | None:
    """Client names -> tokens, from --token (one client) or --tokens-file; None for an open server."""
    from engine.errors import InvalidRequest

    if args.tokens_file and args.token:
        raise InvalidRequest("give either --token (or $VOLSYNTH_SERVER_TOKEN) or --tokens-file, not both")
    if not args.tokens_file:
        return {"client": args.token} if args.token else None
    try:
        text = Path(args.tokens_file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"cannot read --tokens-file {args.tokens_file}: {type(exc).__name__}") from exc
    tokens: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise InvalidRequest(f"{args.tokens_file} line {number}: write 'NAME TOKEN' (two words)")
        name, token = parts
        if name in tokens or token in tokens.values():
            raise InvalidRequest(f"{args.tokens_file} line {number}: each name and each token once")
        tokens[name] = token
    if not tokens:
        raise InvalidRequest(f"{args.tokens_file} names no client; write 'NAME TOKEN' lines")
    return tokens


def serving_backend(args):
    """The backend the server runs jobs on: torch on a device, or XLA (over --xla-devices, costed on
    --xla-topology)."""
    from engine.backends.factory import is_xla_device, make_backend
    from engine.errors import InvalidRequest

    devices, topology = getattr(args, "xla_devices", None), getattr(args, "xla_topology", None)
    if (devices is not None or topology) and not is_xla_device(args.device):
        raise InvalidRequest("--xla-devices and --xla-topology are for --device xla")
    return make_backend(
        args.device, xla_precision=args.xla_precision, xla_devices=devices, xla_topology=topology
    )


def tls_files(args) -> tuple[str | None, str | None]:
    """The certificate and key to serve with (made for --tls-self-signed); prints the fingerprint."""
    from engine.errors import InvalidRequest
    from engine.server import certificate_file_fingerprint, default_tls_dir, self_signed_certificate

    if args.tls_self_signed:
        cert, key = self_signed_certificate(args.tls_dir or default_tls_dir(), [args.host])
    elif args.tls_cert:
        cert, key = args.tls_cert, args.tls_key
        for path in (cert, key):
            if not os.path.isfile(path):
                raise InvalidRequest(f"no file {path}; give the PEM certificate and key files")
    else:
        return None, None
    fingerprint = certificate_file_fingerprint(cert)
    print(f"TLS certificate SHA-256 fingerprint: {fingerprint}", flush=True)
    print(
        f"  clients pin it: volsynth generate --server https://HOST:{args.port} --server-fingerprint {fingerprint}",
        flush=True,
    )
    return str(cert), str(key)
