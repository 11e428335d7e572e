"""The server audit's classes re-run against a real server on 127.0.0.1, with counts (issue 37).

``python -m tests.engine.hostile.server_audit`` prints, per class, the cases tried, refused clearly (the
documented 4xx), tracebacks (in the server's log or a 5xx), accepted wrongly, lost (a result its owner
could not read) and hangs (no answer in 30 s), and whether token holders were answered during the load.
Loopback only, bounded: a few hundred sockets per class, source addresses 127.0.x.y. Not part of the
pytest run (the same classes are tested, smaller, in tests/engine/server/).
"""

from __future__ import annotations

import io
import json
import logging
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from engine.models.registry import ModelRegistry
from engine.server import ServerLimits, create_app, new_token
from engine.testing import InstantBackend, ServerThread, make_tiny_model

TOKENS = {"alice": new_token(), "bob": new_token()}
HEADS = {
    "alice": {"Authorization": f"Bearer {TOKENS['alice']}"},
    "bob": {"Authorization": f"Bearer {TOKENS['bob']}"},
}
COLUMNS = ("tried", "refused", "tracebacks", "accepted_wrongly", "lost", "hangs")


class Tally:
    def __init__(self) -> None:
        self.rows: dict[str, dict[str, int]] = {}

    def add(self, name: str, **counts: int) -> None:
        row = self.rows.setdefault(name, dict.fromkeys(COLUMNS, 0) | {"probes_ok": 0, "probes": 0})
        for key, value in counts.items():
            row[key] += value


def _sock(port: int, i: int) -> socket.socket:
    return socket.create_connection(
        ("127.0.0.1", port), timeout=30, source_address=(f"127.0.{1 + i // 250}.{1 + i % 250}", 0)
    )


def _status(sock: socket.socket) -> int | None:
    """The status the server answered, 0 if it closed without one, None if nothing came in 30 s."""
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                return 0
            data += chunk
    except TimeoutError:
        return None
    except OSError:
        return 0
    return int(data[9:12])


def _probe(url: str, tally: Tally, name: str, n: int = 5) -> None:
    with httpx.Client(base_url=url, timeout=30, headers=HEADS["alice"]) as client:
        codes = [client.get("/info").status_code for _ in range(n)]
    tally.add(name, probes=n, probes_ok=codes.count(200))


def _heads(
    url: str, tally: Tally, name: str, head: bytes, count: int, addresses: int, refused: set[int]
) -> None:
    port = int(url.rsplit(":", 1)[1])
    socks = []
    for i in range(count):
        sock = _sock(port, i % addresses)
        sock.sendall(head)
        socks.append(sock)
    _probe(url, tally, name)
    for sock in socks:
        code = _status(sock)
        tally.add(
            name,
            tried=1,
            refused=int(code in refused or code == 0),
            accepted_wrongly=int(code is not None and 200 <= code < 300),
            tracebacks=int(code is not None and code >= 500 and code != 503),
            hangs=int(code is None),
        )
        sock.close()


def main() -> int:
    log = io.StringIO()  # every log record of the servers (log_config=None: uvicorn keeps this handler)
    logging.basicConfig(level=logging.WARNING, stream=log)
    root = Path(tempfile.mkdtemp(prefix="volsynth-audit-"))
    make_tiny_model(root / "tiny-pixel", model_id="tiny-pixel", kind="pixel", conditioned=False)
    registry = ModelRegistry([root])
    tally = Tally()
    limits = ServerLimits(auth_base_delay_s=1.0, auth_max_delay_s=2.0)
    app = create_app(InstantBackend(registry), token=TOKENS, limits=limits)
    with ServerThread(app, log_config=None) as url:
        for name, auth in (
            ("1 bodiless POST, no token", b""),
            ("1 bodiless POST, wrong token", b"Authorization: Bearer nope\r\n"),
        ):
            head = (
                b"POST /jobs HTTP/1.1\r\nHost: x\r\n"
                + auth
                + b"Content-Type: application/json\r\nContent-Length: 60000\r\n\r\n"
            )
            _heads(url, tally, name, head, count=340, addresses=40, refused={401, 429})
        head = b"GET /info HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer wrong\r\n\r\n"
        time.sleep(limits.auth_max_delay_s)  # the last class's guesses left; start from an empty queue
        _heads(
            url,
            tally,
            "2 waiting guesses, 25 addresses x 16",
            head,
            count=400,
            addresses=25,
            refused={401, 429},
        )
        # 3: wrong guesses and the token holder behind one address
        port = int(url.rsplit(":", 1)[1])
        socks = [_sock(port, 900) for _ in range(20)]
        for sock in socks:
            sock.sendall(head)
        transport = httpx.HTTPTransport(local_address="127.0.4.151")
        with httpx.Client(base_url=url, timeout=30, headers=HEADS["alice"], transport=transport) as client:
            codes = [client.get("/info").status_code for _ in range(10)]
        tally.add(
            "3 token holder behind a guessing address",
            tried=10,
            accepted_wrongly=0,
            probes=10,
            probes_ok=codes.count(200),
        )
        for sock in socks:
            sock.close()
        # 36.4: schemes
        with httpx.Client(base_url=url, timeout=30) as client:
            before = app.state.gate.total_failures
            for value in (
                "bearer {t}",
                "BEARER {t}",
                "Bearer\t{t}",
                "Basic {t}",
                "{t}",
                "Bearer",
                "Bearer {t} {t}",
                "Token {t}",
                "",
            ):
                code = client.get(
                    "/info", headers={"Authorization": value.format(t=TOKENS["alice"])}
                ).status_code
                good = value.lower().startswith("bearer {t}") and value.count("{t}") == 1
                tally.add(
                    "36.4 schemes",
                    tried=1,
                    refused=int(not good and code == 401),
                    accepted_wrongly=int(not good and code == 200),
                    lost=int(good and code != 200),
                )
            # a malformed scheme counted as a wrong guess would be a refusal for the wrong reason
            tally.add("36.4 schemes", accepted_wrongly=app.state.gate.total_failures - before)
        # 4: ownership, fairness, results kept
        with (
            httpx.Client(base_url=url, timeout=30, headers=HEADS["alice"]) as alice,
            httpx.Client(base_url=url, timeout=30, headers=HEADS["bob"]) as bob,
        ):
            job = alice.post("/jobs", json={"model": "tiny-pixel", "steps": 2}).json()["id"]
            deadline = time.monotonic() + 30
            while not app.state.manager.get(job).done and time.monotonic() < deadline:
                time.sleep(0.02)
            for method, path in (
                ("GET", f"/jobs/{job}/events"),
                ("GET", f"/jobs/{job}/volumes"),
                ("DELETE", f"/jobs/{job}"),
                ("GET", f"/jobs/{job}/events?since=0"),
            ):
                code = bob.request(method, path).status_code
                tally.add(
                    "4 another client's job",
                    tried=1,
                    refused=int(code == 404),
                    accepted_wrongly=int(code != 404),
                )
            for _ in range(20):
                b = bob.post("/jobs", json={"model": "tiny-pixel", "steps": 1})
                tally.add("4 another client's 20 jobs", tried=1, tracebacks=int(b.status_code >= 500))
                if b.status_code == 200:
                    deadline = time.monotonic() + 30
                    while not app.state.manager.get(b.json()["id"]).done and time.monotonic() < deadline:
                        time.sleep(0.02)
            tally.add(
                "4 another client's 20 jobs", lost=int(alice.get(f"/jobs/{job}/volumes").status_code != 200)
            )
        # 8: simultaneous streams, big heads in one segment
        gate = threading.Event()

        class Held(InstantBackend):
            def sample(self, request):
                gate.wait(60)
                return (yield from super().sample(request))

    held = create_app(Held(registry), token=TOKENS)
    with ServerThread(held, log_config=None) as url:
        port = int(url.rsplit(":", 1)[1])
        job = httpx.post(
            f"{url}/jobs", json={"model": "tiny-pixel"}, headers=HEADS["alice"], timeout=30
        ).json()["id"]
        request = f"GET /jobs/{job}/events HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKENS['alice']}\r\n\r\n".encode()
        socks: list = [None] * 300
        go = threading.Barrier(300)

        def open_stream(i: int) -> None:
            go.wait()
            sock = _sock(port, i % 60)
            sock.sendall(request)
            socks[i] = sock

        threads = [threading.Thread(target=open_stream, args=(i,)) for i in range(300)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        codes = [_status(s) for s in socks]
        tally.add(
            "8 300 streams at once (limit 256)",
            tried=300,
            refused=codes.count(429),
            accepted_wrongly=max(0, codes.count(200) - 256),
            hangs=codes.count(None),
        )
        gate.set()
        for s in socks:
            s.close()
        for size in (16 * 1024 + 1, 17 * 1024, 32 * 1024, 64 * 1024, 200 * 1024, 1024 * 1024):
            sock = _sock(port, 0)
            sock.sendall(
                b"GET /info HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + TOKENS["alice"].encode()
                + b"\r\nX-Pad: "
                + b"a" * size
                + b"\r\n\r\n"
            )
            code = _status(sock)
            tally.add(
                "8 heads over 16 kB, one write",
                tried=1,
                refused=int(code == 400),
                accepted_wrongly=int(code == 200),
                hangs=int(code is None),
            )
            sock.close()
        _probe(url, tally, "8 heads over 16 kB, one write")
    _tls_class(registry, tally)
    tracebacks = log.getvalue().count("Traceback")
    print(f"{'class':44} " + " ".join(f"{c:>8}" for c in (*COLUMNS, "probes")))
    for name, row in tally.rows.items():
        probes = f"{row['probes_ok']}/{row['probes']}" if row["probes"] else "-"
        print(f"{name:44} " + " ".join(f"{row[c]:>8}" for c in COLUMNS) + f" {probes:>8}")
    print(f"server log: {len(log.getvalue().splitlines())} lines, {tracebacks} tracebacks")
    print(json.dumps({"rows": tally.rows, "log_tracebacks": tracebacks}), file=sys.stderr)
    return 0


def _tls_class(registry, tally: Tally) -> None:
    """Class 1 over TLS: the handshake done, then a bodiless POST without a token."""
    import ssl

    from engine.server import self_signed_certificate

    cert, key = self_signed_certificate(Path(tempfile.mkdtemp(prefix="volsynth-audit-tls-")), ["127.0.0.1"])
    app = create_app(InstantBackend(registry), token=TOKENS)
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    name = "1 bodiless POST, no token, TLS"
    with ServerThread(app, ssl_certfile=cert, ssl_keyfile=key, log_config=None) as url:
        port = int(url.rsplit(":", 1)[1])
        socks = []
        for i in range(200):
            sock = context.wrap_socket(_sock(port, i % 40))
            sock.sendall(b"POST /jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 60000\r\n\r\n")
            socks.append(sock)
        with httpx.Client(base_url=url, timeout=30, headers=HEADS["alice"], verify=False) as client:
            codes = [client.get("/info").status_code for _ in range(5)]
        tally.add(name, probes=5, probes_ok=codes.count(200))
        for sock in socks:
            code = _status(sock)
            tally.add(
                name,
                tried=1,
                refused=int(code in (401, 0)),
                accepted_wrongly=int(code == 200),
                hangs=int(code is None),
            )
            sock.close()


if __name__ == "__main__":
    raise SystemExit(main())
