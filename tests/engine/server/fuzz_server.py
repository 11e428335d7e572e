"""Fuzz the engine server with schemathesis for a while; count 5xx answers and hangs.

    .venv/bin/python -m tests.engine.fuzz_server --minutes 5   # from the repository root

Starts a real uvicorn engine server on 127.0.0.1 (a tiny model in its registry, the instant backend so
that jobs finish at once and the HTTP layer is what gets exercised, a token, the server's own metrics)
and runs ``schemathesis run`` against its OpenAPI schema with every check, all phases (coverage,
fuzzing, stateful: jobs are created, streamed, fetched and deleted through the schema's links) and a
per-request timeout: a request that gets no complete answer within it counts as a hang. Prints one
summary line and writes the schemathesis JSON report to ``--report-dir``.

Needs schemathesis (``pip install -e '.[dev]'``).

A test harness, so it lives with the tests (its short run is ``test_server_fuzz.py``): it serves
the test doubles of ``engine.testing``, which sits above the server in the engine's layers, and needs a
dev-only dependency.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


class _Counter:
    """ASGI middleware: counts requests and answers by status class, as the server saw them."""

    def __init__(self, app, counts: dict) -> None:
        self.app, self.counts = app, counts

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        self.counts["requests"] += 1

        async def counting_send(message):
            if message["type"] == "http.response.start":
                key = f"{message['status'] // 100}xx"
                self.counts[key] = self.counts.get(key, 0) + 1
            await send(message)

        await self.app(scope, receive, counting_send)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="fuzzing time (default 5)")
    parser.add_argument(
        "--request-timeout", type=float, default=30.0, help="seconds before a request is a hang"
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--report-dir", default=None, help="where to keep the JSON report (default: a temp dir)"
    )
    args = parser.parse_args(argv)

    from engine.models.registry import ModelRegistry
    from engine.server import ServerLimits, create_app, new_token
    from engine.telemetry import Sampler
    from engine.testing import InstantBackend, ServerThread, make_tiny_model

    work = Path(tempfile.mkdtemp(prefix="volsynth-fuzz-"))
    make_tiny_model(work / "models" / "tiny-pixel", model_id="tiny-pixel", kind="pixel", conditioned=False)
    token = new_token()
    metrics = Sampler(interval_s=0.5)
    metrics.start()
    # schemathesis's ignored_auth check sends made-up tokens: answered at once, not backed off (the back-off
    # has its own tests), so the run spends its minutes on the API
    # and a client's own newest jobs do not evict the results schemathesis reads back later
    limits = ServerLimits(auth_free_failures=10**9, finished_jobs_kept=10**6)
    app = create_app(
        InstantBackend(ModelRegistry([work / "models"])), token=token, metrics_source=metrics, limits=limits
    )
    counts = {"requests": 0}
    app.add_middleware(_Counter, counts=counts)
    report_dir = Path(args.report_dir or work / "report")
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        "OPENAPI_URL",
        "--header",
        f"Authorization: Bearer {token}",
        "--checks",
        "all",
        "--max-time",
        str(int(args.minutes * 60)),
        "--request-timeout",
        str(args.request_timeout),
        "--report",
        "json",
        "--report-dir",
        str(report_dir),
        "--suppress-health-check",
        "all",
    ]
    if args.seed is not None:
        command += ["--seed", str(args.seed)]
    try:
        with ServerThread(app) as url:
            command[2] = f"{url}/openapi.json"
            shown = " ".join("Authorization: Bearer ***" if "Bearer" in c else c for c in command)
            print(f"$ {shown}", flush=True)
            completed = subprocess.run(command, env={**os.environ, "NO_COLOR": "1"}, check=False)
            deadline = time.monotonic() + 30
            while app.state.streams["open"] and time.monotonic() < deadline:
                time.sleep(0.1)  # streams of requests schemathesis gave up on end at their next write
            streams = dict(app.state.streams)
    finally:
        metrics.stop()
    reports = sorted(glob.glob(str(report_dir / "*.json")))
    report = json.loads(Path(reports[-1]).read_text()) if reports else {}
    failures = {f["code"]: f["count"] for f in report.get("failures", [])}
    errors = report.get("errors", [])
    server_errors = counts.get("5xx", 0)
    hangs = sum(
        1 for e in errors if "timeout" in json.dumps(e).lower() or "timed out" in json.dumps(e).lower()
    )
    print(
        f"fuzz: {report.get('test_cases', {}).get('generated', '?')} test cases, {counts['requests']} requests "
        f"in {report.get('running_time', 0):.0f} s; answers {json.dumps({k: v for k, v in counts.items() if 'xx' in k}, sort_keys=True)}; "
        f"5xx: {server_errors}; hangs (no answer in {args.request_timeout:g} s): {hangs}; "
        f"streams left open: {streams['open']}; schemathesis failures: {failures or 'none'}; "
        f"errors: {len(errors)}; report: {reports[-1] if reports else 'none'}",
        flush=True,
    )
    ok = server_errors == 0 and hangs == 0 and not errors and streams["open"] == 0
    return 0 if ok and completed.returncode in (0, 1) else 1


if __name__ == "__main__":
    sys.exit(main())
