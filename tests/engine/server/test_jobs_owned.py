"""Jobs belong to the client that made them (issue 37, point 4), and the stream limit holds when streams
arrive together (point 8). A real uvicorn server on 127.0.0.1 with one token per client.

Before: any token holder read or cancelled any job whose id it knew; one client filled the queue of 8;
``Retry-After`` was 5 s per waiting job whatever their length; 17 one-step jobs of one client evicted
another's finished, unread result; 260 event streams opened together all got 200 (limit 256).

Estimates are checked on a clock the test steps by hand (``StoppedClock``): exact numbers, no waiting.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from engine.server import ServerLimits, create_app, new_token
from engine.testing import InstantBackend, ServerThread
from tests.engine.server.gated import GatedBackend, StoppedClock

TOKENS = {"alice": new_token(), "bob": new_token(), "carol": new_token()}


def _client(url: str, who: str) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {TOKENS[who]}"})


def _submit(client: httpx.Client, **fields) -> httpx.Response:
    body = {"model": "tiny-pixel", "steps": 2, **fields}
    return client.post("/jobs", content=json.dumps(body), headers={"Content-Type": "application/json"})


def _wait(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


class RecordingBackend(GatedBackend):
    """Gated, and records the seed of each job in the order the jobs start."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.order: list[int] = []

    def sample(self, request):
        self.order.append(request.seed)
        return (yield from super().sample(request))


@pytest.fixture
def gated(registry):
    backend = RecordingBackend(InstantBackend(registry))
    yield backend
    backend.gate.set()


def test_other_clients_get_404_for_a_jobs_events_volumes_and_cancel(registry):
    app = create_app(InstantBackend(registry), token=TOKENS)
    with ServerThread(app) as url, _client(url, "alice") as alice, _client(url, "bob") as bob:
        job = _submit(alice).json()["id"]
        _wait(lambda: app.state.manager.get(job).done, "the job to finish")
        for method, path in (
            ("GET", f"/jobs/{job}/events"),
            ("GET", f"/jobs/{job}/volumes"),
            ("DELETE", f"/jobs/{job}"),
        ):
            response = bob.request(method, path)
            assert response.status_code == 404, (method, path)
            assert response.json()["detail"] == f"no job {job}; it may have expired"  # as for no job at all
        assert alice.get(f"/jobs/{job}/events").status_code == 200
        assert alice.get(f"/jobs/{job}/volumes").status_code == 200
        assert alice.delete(f"/jobs/{job}").status_code == 200


def test_each_client_has_a_share_of_the_queue_with_retry_after_from_the_jobs_ahead(gated):
    limits = ServerLimits(max_queued_jobs=3, max_queued_per_client=2)
    app = create_app(gated, token=TOKENS, limits=limits)
    app.state.manager.clock = StoppedClock()
    with (
        ServerThread(app) as url,
        _client(url, "alice") as alice,
        _client(url, "bob") as bob,
        _client(url, "carol") as carol,
    ):
        assert _submit(carol, steps=40, seed=0).status_code == 200  # runs (held at the gate)
        _wait(gated.started.is_set, "the first job to start")
        assert _submit(bob, steps=7, seed=1).status_code == 200
        assert _submit(alice, steps=100, seed=2).status_code == 200
        assert _submit(alice, steps=100, seed=3).status_code == 200
        # nothing has finished here: a job is taken to last 60 s (said so), the running one has all of it left.
        # alice's share (2) is full: a place of hers frees when her first job starts, after the running job
        # and bob's (his came first)
        mine = _submit(alice, steps=5)
        assert mine.status_code == 429 and "of yours" in mine.json()["detail"]
        assert mine.headers["Retry-After"] == "120"
        # the queue (3) is full: a place frees when the running job ends and the next one starts
        full = _submit(carol, steps=5)
        assert full.status_code == 429 and full.headers["Retry-After"] == "60"
        assert full.json()["detail"] == (
            "the engine server is busy (3 jobs are waiting, about 4 min of work at 60 s a job, a guess until "
            "a job has run here); try again in about 60 s, when a place frees"
        )
        gated.gate.set()
        _wait(lambda: all(j.done for j in app.state.manager.jobs.values()), "the jobs to finish")
        assert gated.order == [0, 1, 2, 3]


def test_waiting_jobs_run_in_turn_by_client(gated):
    app = create_app(gated, token=TOKENS)
    with ServerThread(app) as url, _client(url, "alice") as alice, _client(url, "bob") as bob:
        assert _submit(alice, seed=100).status_code == 200
        _wait(gated.started.is_set, "the first job to start")
        for seed in (1, 2, 3):
            assert _submit(alice, seed=seed).status_code == 200
        assert _submit(bob, seed=50).status_code == 200  # after three of alice's, but not last
        gated.gate.set()
        _wait(lambda: all(j.done for j in app.state.manager.jobs.values()), "the jobs to finish")
        assert gated.order == [100, 1, 50, 2, 3]


def test_another_clients_jobs_never_evict_an_unread_result_and_a_read_one_goes(registry):
    limits = ServerLimits(finished_jobs_kept=16, read_ttl_s=0.0)
    app = create_app(InstantBackend(registry), token=TOKENS, limits=limits)
    manager = app.state.manager
    with ServerThread(app) as url, _client(url, "alice") as alice, _client(url, "bob") as bob:
        mine = _submit(alice).json()["id"]
        _wait(lambda: manager.get(mine).done, "alice's job")
        bobs = []
        for _ in range(17):  # one more than a client keeps: his own oldest goes, never alice's
            bobs.append(_submit(bob, steps=1).json()["id"])
            _wait(lambda: manager.get(bobs[-1]).done, "bob's job")
        _submit(bob, steps=1)  # one more submit: the expiry runs
        assert alice.get(f"/jobs/{mine}/volumes").status_code == 200
        assert bob.get(f"/jobs/{bobs[0]}/volumes").status_code == 404  # bob's 16 newest are kept
        assert bob.get(f"/jobs/{bobs[-1]}/volumes").status_code == 200
        _submit(alice)  # read, and read_ttl_s (0 here) has passed: it goes at the next expiry
        assert alice.get(f"/jobs/{mine}/volumes").status_code == 404


@pytest.mark.slow
def test_the_stream_limit_holds_when_streams_arrive_together(gated):
    app = create_app(gated, token=TOKENS["alice"])  # one token, as most servers run
    streams = app.state.streams
    with ServerThread(app) as url, _client(url, "alice") as alice:
        job = _submit(alice).json()["id"]
        port = int(url.rsplit(":", 1)[1])
        request = (
            f"GET /jobs/{job}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {TOKENS['alice']}\r\n\r\n"
        ).encode()
        socks: list[socket.socket] = [None] * 270  # type: ignore[list-item]
        go = threading.Barrier(len(socks))

        def open_stream(i: int) -> None:  # all connect and send at once: no socket idles before its request
            go.wait()
            sock = socket.create_connection(
                ("127.0.0.1", port), timeout=30, source_address=(f"127.0.2.{1 + i % 50}", 0)
            )
            sock.sendall(request)
            socks[i] = sock

        senders = [threading.Thread(target=open_stream, args=(i,)) for i in range(len(socks))]
        for t in senders:
            t.start()
        for t in senders:
            t.join(30)
        try:
            statuses = []
            for sock in socks:
                data = b""
                while b"\r\n" not in data:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                statuses.append(data[9:12])
            assert statuses.count(b"200") == 256 and statuses.count(b"429") == 14, statuses
            assert streams["peak"] == 256
        finally:
            gated.gate.set()
            for sock in socks:
                sock.close()
        _wait(lambda: streams["open"] == 0, "the streams to end")


def test_serve_takes_one_token_per_client_from_a_file(tmp_path, monkeypatch, model_path_env, capsys):
    from engine.cli import main
    from engine.server import serving

    caught = {}
    monkeypatch.setattr(serving, "serve", lambda app, **options: caught.setdefault("app", app))
    monkeypatch.delenv("VOLSYNTH_SERVER_TOKEN", raising=False)
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# clients\nalice {TOKENS['alice']}\nbob {TOKENS['bob']}  # the lab's box\n")
    assert (
        main(["serve", "--device", "cpu", "--tokens-file", str(tokens), "--max-queue-per-client", "2"]) == 0
    )
    assert caught["app"].state.gate.tokens == {"alice": TOKENS["alice"], "bob": TOKENS["bob"]}
    assert caught["app"].state.limits.max_queued_per_client == 2
    for text, message in (
        (f"alice {TOKENS['alice']} extra\n", "line 1: write 'NAME TOKEN'"),
        (f"alice {TOKENS['alice']}\nalice {TOKENS['bob']}\n", "line 2: each name and each token once"),
        ("alice password\n", "too easy to guess"),
        ("# nobody\n", "names no client"),
    ):
        tokens.write_text(text)
        assert main(["serve", "--device", "cpu", "--tokens-file", str(tokens)]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and TOKENS["bob"] not in err


class ClockedBackend(InstantBackend):
    """Instant, but each job takes as many seconds as its seed on the manager's ``StoppedClock``."""

    def __init__(self, registry, clock: StoppedClock) -> None:
        super().__init__(registry)
        self.clock = clock

    def sample(self, request):
        result = yield from super().sample(request)
        self.clock.advance(request.seed)
        return result


def test_waits_are_the_median_job_time_per_job_ahead_and_each_job_is_told_its_place(registry):
    """Before: 1 s a step until a job had finished, and a job in the queue was told nothing but "queued"
    (the report: Retry-After said 1-5 s while each job took 30-60 s)."""
    clock = StoppedClock()
    backend = GatedBackend(ClockedBackend(registry, clock))
    backend.gate.set()
    app = create_app(backend, token=TOKENS, limits=ServerLimits(max_queued_jobs=3))
    manager = app.state.manager
    manager.clock = clock
    try:
        with ServerThread(app) as url, _client(url, "alice") as alice, _client(url, "bob") as bob:
            for seconds in (10, 30, 20):  # three jobs done: the median job takes 20 s
                job = _submit(alice, seed=seconds).json()["id"]
                _wait(lambda: manager.get(job).done, "a measured job")  # noqa: B023 - called at once
            backend.gate.clear()
            _submit(alice, seed=1)  # runs, held at the gate
            _wait(lambda: manager.queued == 0 and manager._running, "the held job to start")
            clock.advance(5)  # it has run 5 s of the 20 a job takes
            ids = [_submit(who, seed=1).json()["id"] for who in (alice, bob, alice)]
            refused = _submit(bob, seed=1)  # the queue (3) is full
            assert refused.status_code == 429 and refused.headers["Retry-After"] == "15"
            assert (
                "about 75 s of work at 20 s a job, the median of the last 3 jobs" in refused.json()["detail"]
            )
            told = {job_id: manager.get(job_id).events[-1] for job_id in ids}
            assert [(e["place"], e["wait_s"], e["job_s"]) for e in told.values()] == [
                (1, 15.0, 20.0),
                (2, 35.0, 20.0),
                (3, 55.0, 20.0),
            ]
            assert told[ids[2]]["message"] == "queued, 3rd in line, about 55 s"
            backend.gate.set()
            _wait(lambda: all(j.done for j in manager.jobs.values()), "the jobs to finish")
            # the last one was told each place it moved to, before its run's first event
            events = [json.loads(line) for line in alice.get(f"/jobs/{ids[2]}/events").text.splitlines()]
            kinds = [e["type"] for e in events]
            assert [e["place"] for e in events if e["type"] == "queued"] == [3, 2, 1]
            assert kinds[:3] == ["queued"] * 3 and kinds[3] == "progress" and kinds[-1] == "result"
    finally:
        backend.gate.set()


def test_a_job_is_told_each_move_to_the_front_and_other_changes_only_up_to_a_bound(registry):
    """Another client that submits and cancels over and over moves a waiting job back and forth: those
    changes are told at most MAX_QUEUE_EVENTS times, while its moves nearer the front are always told."""
    from engine.api import SamplingRequest
    from engine.server.jobs import MAX_QUEUE_EVENTS, JobManager

    backend = GatedBackend(InstantBackend(registry))
    manager = JobManager(backend, ServerLimits())
    request = SamplingRequest(model="tiny-pixel", steps=2)
    try:
        manager.submit(request, owner="alice")  # runs, held at the gate
        _wait(lambda: manager.queued == 0, "the first job to start")
        manager.submit(request, owner="alice")
        second = manager.submit(request, owner="alice")  # 2nd in line
        for _ in range(MAX_QUEUE_EVENTS + 20):
            manager.cancel(manager.submit(request, owner="bob"))  # bob's job goes ahead of it, then leaves
        places = [e["place"] for e in second.events if e["type"] == "queued"]
        assert places[:3] == [2, 3, 2] and len(places) == 1 + MAX_QUEUE_EVENTS
        backend.gate.set()
        _wait(lambda: second.done, "the jobs to finish")
        places = [e["place"] for e in second.events if e["type"] == "queued"]
        assert places[-1] == 1 and len(places) == 2 + MAX_QUEUE_EVENTS  # its move to the front, told
    finally:
        backend.gate.set()


class SlowDecodeBackend(InstantBackend):
    """Instant steps, then a decoding that waits for ``decode`` and takes as many seconds as the seed on the
    manager's ``StoppedClock``."""

    def __init__(self, registry, clock: StoppedClock) -> None:
        super().__init__(registry)
        self.clock = clock
        self.decode = threading.Event()
        self.decoding = threading.Event()

    def sample(self, request):
        result = yield from super().sample(request)  # its steps are done
        self.decoding.set()
        self.decode.wait(60)
        self.clock.advance(request.seed)
        return result


def test_a_decoding_job_is_given_the_job_time_left_not_its_steps_left(registry):
    """Before: a job past its last step had 0 s left by its pace, and a full queue said "try again in 1 s"
    through a decoding that took 20 s."""
    from engine.api import SamplingRequest
    from engine.server.jobs import JobManager, QueueFull

    clock = StoppedClock()
    backend = SlowDecodeBackend(registry, clock)
    manager = JobManager(backend, ServerLimits(max_queued_jobs=1), clock=clock)
    try:
        backend.decode.set()
        measured = manager.submit(SamplingRequest(model="tiny-pixel", seed=20))
        _wait(lambda: measured.done, "a job of 20 s")
        backend.decode.clear()
        backend.decoding.clear()
        manager.submit(SamplingRequest(model="tiny-pixel"))
        _wait(backend.decoding.is_set, "the next job to decode")
        clock.advance(15)
        manager.submit(SamplingRequest(model="tiny-pixel"))  # the queue (1) is full now
        with pytest.raises(QueueFull) as refused:
            manager.submit(SamplingRequest(model="tiny-pixel"))
        assert refused.value.retry_after_s == 5  # 20 s a job, 15 s of it gone
    finally:
        backend.decode.set()
