"""``volsynth serve``: run the engine server for remote clients."""

from __future__ import annotations

import os


def register(sub) -> None:
    parser = sub.add_parser("serve", help="run the engine server (remote backend for the app and CLI)")
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1, this machine "
        "only; use 0.0.0.0 with --token to serve a network)",
    )
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N, mps or auto")
    parser.add_argument(
        "--token",
        default=os.environ.get("VOLSYNTH_SERVER_TOKEN"),
        help="require this bearer token (default: $VOLSYNTH_SERVER_TOKEN)",
    )
    parser.set_defaults(func=run)


def run(args) -> int:
    import uvicorn

    from engine.backends.local import LocalBackend
    from engine.errors import InvalidRequest
    from engine.server import create_app

    if args.host not in ("127.0.0.1", "localhost", "::1") and not args.token:
        raise InvalidRequest("serving beyond this machine needs --token (volumes may hold patient data)")
    from engine.telemetry import Sampler

    metrics = Sampler()  # the server's own GPU/CPU metrics, for clients' metrics views (GET /metrics)
    metrics.start()
    try:
        app = create_app(LocalBackend(args.device), token=args.token, metrics_source=metrics)
        uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    finally:
        metrics.stop()
    return 0
