"""SIGTERM ends the engine server within its stated grace, and tells every client of a job at once (issue 37,
point 6). ``volsynth serve`` runs as its own process on 127.0.0.1, with the tiny models.

Before: on SIGTERM the server stopped accepting but ran until the current job ended (3.5 minutes for a
150-step job, unbounded for a long one), and the client of a queued job learnt it only at the end.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from engine.server import new_token

REPO = Path(__file__).resolve().parents[3]
TOKEN = new_token()
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stream(url: str, job: str, lines: list[dict], seen: dict[str, threading.Event]) -> None:
    with httpx.stream("GET", f"{url}/jobs/{job}/events", headers=AUTH, timeout=120) as response:
        for line in response.iter_lines():
            if line:
                event = json.loads(line)
                lines.append(event)
                if event["type"] == "progress" and event.get("stage") == "denoise":
                    seen["progress"].set()
                if event["type"] == "notice":
                    seen["notice"].set()


def _shut_down(tiny_models_dir, grace: str, signals: list[int]):
    """``volsynth serve`` with a running and a queued job, sent ``signals`` (each after the running job's
    client has been told of the one before). Returns (running job's events, queued job's events, exit
    status, stderr, port)."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, VOLSYNTH_MODEL_PATH=str(tiny_models_dir), PYTHONUNBUFFERED="1")
    env.pop("VOLSYNTH_SERVER_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine", "serve", "--device", "cpu", "--port", str(port), "--token", TOKEN]
        + ["--shutdown-grace", grace],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:  # until it listens
            assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
            try:
                if httpx.get(f"{url}/info", headers=AUTH, timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        body = {"model": "tiny-pixel", "steps": 1000}  # minutes of work here: it cannot end within the grace
        jobs = [httpx.post(f"{url}/jobs", json=body, headers=AUTH, timeout=30).json()["id"] for _ in range(2)]
        events: list[list[dict]] = [[], []]
        seen = [{"progress": threading.Event(), "notice": threading.Event()} for _ in jobs]
        readers = [
            threading.Thread(target=_stream, args=(url, job, events[i], seen[i]), daemon=True)
            for i, job in enumerate(jobs)
        ]
        for reader in readers:
            reader.start()
        deadline = time.monotonic() + 120
        while not seen[0]["progress"].wait(0.1):
            assert readers[0].is_alive() and time.monotonic() < deadline, f"no denoising: {events[0][-3:]}"
        for n, sig in enumerate(signals):
            if n:  # the server is shutting down (its running job's client was told) before the next one
                assert seen[0]["notice"].wait(60), f"no notice: {events[0][-3:]}"
            proc.send_signal(sig)
        for reader in readers:
            reader.join(60)
        assert not any(r.is_alive() for r in readers), "an event stream did not end"
        status = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    return events[0], events[1], status, proc.stderr.read(), port


@pytest.mark.slow
def test_sigterm_cancels_the_running_job_after_the_grace_and_tells_every_client_at_once(tiny_models_dir):
    grace = "1"
    running, queued, status, err, port = _shut_down(tiny_models_dir, grace, [signal.SIGTERM])
    # uvicorn re-raises the signal once it has shut down: the exit is the signal's
    assert status in (0, -signal.SIGTERM)
    events = [running, queued]
    running, queued = events
    # the queued job: its stream ends with the error, it never ran
    assert [e["type"] for e in queued] == ["queued", "error"]
    assert "shutting down" in queued[-1]["message"] and queued[-1]["error_class"] == "BackendUnavailable"
    # the running job: told at once, then cancelled with the error when the grace ended
    kinds = [e["type"] for e in running]
    assert kinds[-1] == "error" and kinds.count("notice") == 1, kinds[-5:]
    assert f"within {grace} s" in running[kinds.index("notice")]["message"]
    assert "shut down" in running[-1]["message"] and f"{grace} s grace" in running[-1]["message"]
    assert "Traceback" not in err
    with pytest.raises(OSError):  # it stopped accepting
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


@pytest.mark.slow
@pytest.mark.parametrize("presses", [1, 2], ids=["ctrl-c", "ctrl-c-twice"])
def test_ctrl_c_shuts_down_as_cleanly_as_sigterm(tiny_models_dir, presses):
    """SIGINT: the same bounded shutdown as SIGTERM, ended by the signal; a second one ends the grace at once
    instead of cutting the streams. Before: exit -6 (SIGABRT, "terminate called without an active
    exception"), and after a second Ctrl-C tracebacks and a stream cut after its notice, with no error."""
    grace = "1" if presses == 1 else "600"  # twice: only the second press can end the job in time
    running, queued, status, err, _ = _shut_down(tiny_models_dir, grace, [signal.SIGINT] * presses)
    assert status == -signal.SIGINT, err[-2000:]
    assert "Traceback" not in err and "terminate called" not in err, err[-2000:]
    assert [e["type"] for e in queued] == ["queued", "error"]
    kinds = [e["type"] for e in running]
    assert kinds[-1] == "error" and kinds.count("notice") == 1, kinds[-5:]
    assert "shut down" in running[-1]["message"]
