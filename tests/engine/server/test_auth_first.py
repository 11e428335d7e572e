"""The token is judged on the headers, before any body is read or any queue entered (issue 37, points 1-3;
issue 36, point 4).

A real uvicorn server on 127.0.0.1 with the limits ``volsynth serve`` runs with; the load is bounded and
loopback-only: a few hundred sockets, bound to distinct 127.x.y.z source addresses (Linux routes all of
127.0.0.0/8 on lo), each test a few seconds. Before: ~340 sockets sending complete ``POST /jobs`` headers
with ``Content-Length: 60000`` and no body made every authenticated request 503 (the body limit read the
body before the token check, inside the in-flight count); 25 addresses x 16 waiting wrong guesses did the
same; wrong guesses from an address got its token holder 429; ``bearer`` (lower case) was a wrong guess.
"""

from __future__ import annotations

import contextlib
import socket
import time

import httpx
import pytest

from engine.server import ServerLimits, create_app, new_token
from engine.testing import InstantBackend, ServerThread

TOKEN = new_token()
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _source(i: int) -> str:
    """The i-th of many loopback source addresses (127.0.1.1, 127.0.1.2, ...)."""
    return f"127.0.{1 + i // 250}.{1 + i % 250}"


@contextlib.contextmanager
def _heads_sent(url: str, head: bytes, count: int, addresses: int):
    """``count`` sockets that sent ``head`` from ``addresses`` source addresses in turn, closed on exit."""
    socks: list[socket.socket] = []
    try:
        for i in range(count):
            sock = socket.create_connection(
                ("127.0.0.1", _port(url)), timeout=30, source_address=(_source(i % addresses), 0)
            )
            sock.sendall(head)
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def _status_line(sock: socket.socket) -> bytes:
    """The status line the server answered on ``sock`` (b"" if it closed without one)."""
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    return data.split(b"\r\n", 1)[0]


def _authenticated_probes(url: str, n: int = 8) -> list[int]:
    statuses = []
    with httpx.Client(base_url=url, timeout=30) as client:
        statuses += [client.get("/info", headers=AUTH).status_code for _ in range(n)]
    statuses.append(httpx.get(f"{url}/info", headers=AUTH, timeout=30).status_code)  # a fresh connection
    return statuses


@pytest.fixture
def instant(registry):
    return InstantBackend(registry)


@pytest.mark.parametrize(
    "authorization", [b"", b"Authorization: Bearer not-the-token\r\n"], ids=["none", "wrong"]
)
def test_bodiless_posts_without_the_token_do_not_crowd_out_token_holders(instant, authorization):
    # free_failures high: every wrong guess is answered at once, so this is about the body and the slots
    app = create_app(instant, token=TOKEN, limits=ServerLimits(auth_free_failures=10**6))
    head = (
        b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + authorization
        + b"Content-Length: 60000\r\n\r\n"
    )  # ... and never the body
    with ServerThread(app) as url, _heads_sent(url, head, count=340, addresses=20) as socks:
        assert _authenticated_probes(url) == [200] * 9
        # each was answered on its headers alone, 401 without reading the body, and closed
        assert {_status_line(s)[:12] for s in socks[:40]} == {b"HTTP/1.1 401"}


def test_waiting_wrong_guesses_from_many_addresses_are_capped_and_hold_no_in_flight_slot(instant):
    limits = ServerLimits(
        auth_free_failures=0, auth_base_delay_s=3.0, auth_max_delay_s=3.0, auth_max_waiting=16
    )
    app = create_app(instant, token=TOKEN, limits=limits)
    gate = app.state.gate
    head = b"GET /info HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer wrong-guess\r\n\r\n"
    # 25 addresses x 16: the old per-address cap
    with ServerThread(app) as url, _heads_sent(url, head, count=400, addresses=25) as socks:
        statuses = _authenticated_probes(url)
        assert statuses == [200] * 9
        assert gate.peak_waiting_total <= limits.auth_max_waiting_total
        # the guesses beyond the global cap were answered 429 at once, not left waiting
        answered = [_status_line(s)[:12] for s in socks[-40:]]
        assert answered.count(b"HTTP/1.1 429") >= 30, answered


def test_wrong_guesses_at_an_address_do_not_lock_out_the_right_token_there(instant):
    limits = ServerLimits(
        auth_free_failures=0, auth_base_delay_s=3.0, auth_max_delay_s=3.0, auth_max_waiting=4
    )
    app = create_app(instant, token=TOKEN, limits=limits)
    head = b"GET /info HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer wrong-guess\r\n\r\n"
    # all from 127.0.1.1, more than its cap
    with ServerThread(app) as url, _heads_sent(url, head, count=12, addresses=1) as socks:
        assert _status_line(socks[-1]).startswith(b"HTTP/1.1 429")  # the address's cap is full
        with httpx.Client(
            base_url=url, timeout=30, transport=httpx.HTTPTransport(local_address=_source(0))
        ) as client:  # the token holder behind the same address
            assert [client.get("/info", headers=AUTH).status_code for _ in range(5)] == [200] * 5


def test_the_bearer_scheme_is_case_insensitive_and_a_malformed_one_is_no_guess(instant):
    app = create_app(instant, token=TOKEN, limits=ServerLimits(auth_free_failures=0, auth_base_delay_s=0.01))
    gate = app.state.gate
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        for scheme in ("Bearer", "bearer", "BEARER", "bEaReR"):
            assert client.get("/info", headers={"Authorization": f"{scheme} {TOKEN}"}).status_code == 200
        for value in (f"Basic {TOKEN}", TOKEN, "Bearer", f"Bearer  {TOKEN} extra", f"Token {TOKEN}"):
            response = client.get("/info", headers={"Authorization": value})
            assert response.status_code == 401 and "Bearer <token>" in response.json()["detail"]
        assert client.get("/info").status_code == 401
        assert gate.total_failures == 0 and not gate.delays  # none counted as a wrong guess, none waited
        assert client.get("/info", headers={"Authorization": "bearer wrong"}).status_code == 401
        assert gate.total_failures == 1


def test_headers_over_16_kb_are_400_even_in_one_segment(instant):
    app = create_app(instant, token=TOKEN)
    with ServerThread(app) as url:
        for size, expected in (
            (15 * 1024, b"HTTP/1.1 200"),
            (17 * 1024, b"HTTP/1.1 400"),
            (200 * 1024, b"HTTP/1.1 400"),
        ):
            head = (
                b"GET /info HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n"
                b"X-Pad: " + b"a" * (size - 200) + b"\r\n\r\n"
            )
            sock = socket.create_connection(("127.0.0.1", _port(url)), timeout=30)
            try:
                sock.sendall(head)  # one write: the whole head reaches the server at once
                assert _status_line(sock)[:12] == expected, size
            finally:
                sock.close()
        assert httpx.get(f"{url}/info", headers=AUTH, timeout=30).status_code == 200


def test_a_waiting_wrong_guess_whose_client_left_frees_its_place(instant):
    limits = ServerLimits(
        auth_free_failures=0, auth_base_delay_s=30.0, auth_max_delay_s=30.0, auth_max_waiting=4
    )
    app = create_app(instant, token=TOKEN, limits=limits)
    gate = app.state.gate
    head = b"GET /info HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer wrong-guess\r\n\r\n"
    with ServerThread(app) as url:
        deadline = time.monotonic() + 30
        with _heads_sent(url, head, count=4, addresses=1):
            while gate.waiting_total < 4:  # all four are waiting (30 s each, in turn)
                assert time.monotonic() < deadline, "the guesses never waited"
                time.sleep(0.02)
        # leaving the block closed the four sockets
        while gate.waiting_total:  # they leave: their places are freed, not held for minutes
            assert time.monotonic() < deadline, f"{gate.waiting_total} abandoned guesses still wait"
            time.sleep(0.02)
        assert gate.abandoned == 4
