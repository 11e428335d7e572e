"""Weak tokens are refused and the wrong-token back-off holds for guesses sent in parallel (issue 24,
point 8). Before: a 1-character token started on loopback, the alphabet passed the network rule, and 200
parallel wrong guesses from one address were all answered within about 10 s (each waited on its own)."""

from __future__ import annotations

import string
import threading

import httpx
import pytest

from engine.backends.local import LocalBackend
from engine.cli import main
from engine.errors import InvalidRequest
from engine.server import ServerLimits, check_bind, create_app, new_token, token_strength_bits
from engine.testing import ServerThread

TOKEN = new_token()


@pytest.mark.parametrize(
    "weak",
    [
        "x",
        "password",
        string.ascii_letters[:43],
        "ab" * 30,
        string.ascii_lowercase + string.digits * 2,
        "qwertyuiopasdfghjklzxcvbnm" * 2,
    ],
    ids=["one-char", "word", "alphabet-43", "repeated", "runs", "keyboard-rows"],
)
def test_weak_tokens_are_refused_on_loopback_and_on_a_network(weak, capsys):
    with pytest.raises(InvalidRequest, match="too easy to guess"):
        check_bind("127.0.0.1", weak, tls=False)
    with pytest.raises(InvalidRequest, match="too easy to guess"):
        check_bind("0.0.0.0", weak, tls=True)
    assert main(["serve", "--token", weak, "--port", "1"]) == 2  # refused before anything binds
    err = capsys.readouterr().err
    assert "too easy to guess" in err and "--new-token" in err and "Traceback" not in err


def test_made_tokens_are_strong():
    assert min(token_strength_bits(new_token()) for _ in range(500)) >= 200
    check_bind("0.0.0.0", new_token(), tls=True)


def _guess_in_parallel(url: str, n: int) -> list[int]:
    statuses: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(n)

    def guess(i: int) -> None:
        start.wait()
        code = httpx.get(
            f"{url}/info", headers={"Authorization": f"Bearer guess-{i}"}, timeout=60
        ).status_code
        with lock:
            statuses.append(code)

    threads = [threading.Thread(target=guess, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return statuses


@pytest.mark.slow
def test_parallel_wrong_guesses_from_one_address_wait_in_turn(registry):
    limits = ServerLimits(
        auth_free_failures=0, auth_base_delay_s=0.02, auth_max_delay_s=0.05, auth_max_waiting=64
    )
    app = create_app(LocalBackend("cpu", registry), token=TOKEN, limits=limits)
    gate = app.state.gate
    with ServerThread(app) as url:
        statuses = _guess_in_parallel(url, 40)
        assert statuses == [401] * 40
        waits = sorted(gate.answered)
        assert len(waits) == 40 and all(d > 0 for d in list(gate.delays)[-40:])
        # each guess's wait began only after the previous one was answered: no two overlap
        assert all(nxt[0] >= prev[1] for prev, nxt in zip(waits, waits[1:], strict=False)), waits[:5]
        assert (
            httpx.get(f"{url}/info", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30).status_code
            == 200
        )


@pytest.mark.slow
def test_more_waiting_guesses_than_the_limit_are_answered_429_without_a_verdict(registry):
    limits = ServerLimits(
        auth_free_failures=0, auth_base_delay_s=1.0, auth_max_delay_s=1.0, auth_max_waiting=3
    )
    app = create_app(LocalBackend("cpu", registry), token=TOKEN, limits=limits)
    with ServerThread(app) as url:
        statuses = _guess_in_parallel(url, 12)
        assert set(statuses) <= {401, 429} and statuses.count(429) >= 1 and app.state.gate.refused_busy >= 1
        assert statuses.count(401) == app.state.gate.total_failures  # a 429 gave no verdict on its token


def test_new_tokens_never_start_with_a_dash_so_token_x_takes_them(capsys):
    # 1 in 64 URL-safe tokens would start with "-": over 2000 draws one would almost surely (1 - 1e-14)
    tokens = [new_token() for _ in range(2000)]
    assert not [t for t in tokens if t.startswith("-")]
    assert min(len(t) for t in tokens) == 43
    assert main(["serve", "--new-token"]) == 0
    printed = capsys.readouterr().out.strip()
    from engine.cli import build_parser

    assert build_parser().parse_args(["serve", "--token", printed]).token == printed
