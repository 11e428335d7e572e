"""The remote backend against a real uvicorn engine server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from engine.api import Progress, SamplingRequest, run
from engine.backends.remote import RemoteBackend
from engine.errors import BackendUnavailable, Cancelled, InvalidRequest
from engine.server import create_app
from engine.testing import ServerThread


@pytest.fixture
def server(backend):
    app = create_app(backend, token="s3cret")
    with ServerThread(app) as url:
        yield url, app


def test_remote_result_equals_local(server, backend):
    url, _ = server
    remote = RemoteBackend(url, token="s3cret")
    request = SamplingRequest(
        model="tiny-latent", steps=4, seed=3, preview_interval=2, conditioning={"brain_volume": 1000}
    )
    events: list[Progress] = []
    result = run(remote.sample(request), events.append)
    expected = run(backend.sample(request))
    assert np.array_equal(result.volumes, expected.volumes)
    assert np.array_equal(result.affine, expected.affine)
    assert result.provenance["backend"] == "remote" and result.provenance["server"] == url
    assert [e.stage for e in events][:1] == ["load"]
    assert any(e.preview is not None and e.preview.shape == (16, 24, 16) for e in events)
    assert remote.info().device.startswith(url)
    assert {m["id"] for m in remote.models()} >= {"tiny-latent"}


def test_remote_errors_keep_their_class_and_message(server):
    url, _ = server
    remote = RemoteBackend(url, token="s3cret")
    with pytest.raises(InvalidRequest, match="has no condition 'age'.*on the engine server"):
        run(remote.sample(SamplingRequest(model="tiny-latent", conditioning={"age": 3})))
    with pytest.raises(InvalidRequest, match="unknown request field"):
        remote._call(
            "POST",
            "/jobs",
            content='{"model": "x", "bogus": 1}',
            headers={"Content-Type": "application/json"},
        )


def test_remote_cancel_stops_the_server_job(server):
    url, app = server
    remote = RemoteBackend(url, token="s3cret")
    job = remote.sample(SamplingRequest(model="tiny-latent", steps=1000))
    for progress in job:
        if progress.stage == "denoise" and progress.step >= 2:
            break
    manager = app.state.manager
    (server_job,) = manager.jobs.values()
    job.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not server_job.done:
        time.sleep(0.05)
    assert not manager.jobs  # cancelled jobs are forgotten
    assert server_job.events[-1]["type"] == "cancelled"
    steps = [e["step"] for e in server_job.events if e["type"] == "progress" and e["stage"] == "denoise"]
    assert max(steps) < 1000


def test_wrong_token_and_unreachable_server(server):
    url, _ = server
    with pytest.raises(BackendUnavailable, match="refused the token"):
        RemoteBackend(url, token="wrong").info()
    with pytest.raises(BackendUnavailable, match="cannot reach the engine server"):
        RemoteBackend("http://127.0.0.1:9", timeout_s=2).info()


def test_cli_generate_on_server(server, tmp_path):
    from engine.cli import main

    url, _ = server
    out = tmp_path / "remote.nii.gz"
    assert (
        main(
            [
                "generate",
                "--server",
                url,
                "--token",
                "s3cret",
                "--model",
                "tiny-pixel",
                "--steps",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert out.is_file() and (tmp_path / "remote.json").is_file()


def test_server_reports_its_metrics(backend):
    from engine.telemetry import Sample, Sampler

    metrics = Sampler(interval_s=0.05)
    metrics.start()
    try:
        with ServerThread(create_app(backend, metrics_source=metrics)) as url:
            deadline = time.monotonic() + 10
            while metrics.latest() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            data = RemoteBackend(url).metrics()
    finally:
        metrics.stop()
    sample = Sample.from_dict(data)  # the same structure a local sampler produces
    assert sample.system.ram_total_bytes > 0
    assert sample.gpu_available in (True, False)


def test_compare_runs_on_the_engine_server(server, backend):
    """Kernel profile, loop peak memory and step times come back from the server's runs."""
    from engine.api.optimization_config import OptimizationConfig
    from engine.compare import compare_settings

    url, _ = server
    remote = RemoteBackend(url, token="s3cret")
    request = SamplingRequest(model="tiny-latent", steps=5, seed=1)
    comparison = run(
        compare_settings(
            remote, request, OptimizationConfig(), OptimizationConfig(autocast="bf16"), kernel_profile_steps=1
        )
    )
    assert comparison.a.result.provenance["backend"] == "remote"
    assert np.array_equal(comparison.a.result.volumes, run(backend.sample(request)).volumes)
    assert comparison.b.kernel_profile["steps"] == [2] and comparison.b.kernel_profile["operators"]
    assert comparison.b.peak_kind == "process_rss" and comparison.b.peak_bytes > 0
    assert comparison.b.steps_measured == 3 and comparison.max_abs_err > 0


def test_the_wire_codec_round_trips_and_refuses_garbage():
    """One codec (engine.wire) for the server and the client."""
    from engine import wire
    from engine.api import SamplingResult
    from engine.errors import ModelNotFound

    preview = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    progress = Progress("denoise", 3, 10, 1.5, "step", preview)
    back = wire.progress_from_event(wire.decode_event(wire.encode_event(wire.progress_event(progress))))
    assert back == progress and np.array_equal(back.preview, preview)
    request = SamplingRequest(model="m", steps=3, conditioning={"a": 1.0})
    assert wire.decode_request(json.loads(wire.encode_request(request))) == request
    volumes = np.ones((1, 1, 2, 2, 2), np.float32)
    result = SamplingResult(volumes, np.eye(4), request, {"seed": 0})
    event = wire.decode_event(wire.encode_event(wire.result_event(result)))
    decoded = wire.result_from_event(event, wire.decode_volumes(wire.encode_volumes(volumes)), "https://h:1")
    assert decoded.request == request and decoded.provenance == {
        "seed": 0,
        "backend": "remote",
        "server": "https://h:1",
    }
    error = wire.error_from_event(wire.error_event(ModelNotFound("no model x")))
    assert type(error) is ModelNotFound and "no model x (on the engine server)" in str(error)
    assert type(wire.error_from_event({"error_class": "SystemExit", "message": "x"})) is wire.EngineError
    for bad in ("[1]", "{", '{"type": 3}'):
        with pytest.raises(wire.WireError):
            wire.decode_event(bad)
    with pytest.raises(wire.WireError):
        wire.decode_volumes(b"not a npy file")
    with pytest.raises(InvalidRequest):
        wire.decode_request([])
    assert wire.normalise_fingerprint("sha256:" + "ab" * 32) == ":".join(["AB"] * 32)


def test_tissue_maps_and_space_cross_the_wire_and_a_wrong_count_is_refused():
    from engine import wire
    from engine.api import SamplingResult

    request = SamplingRequest(model="m", steps=3)
    volumes = np.random.default_rng(0).random((1, 3, 4, 4, 4), dtype=np.float32)
    provenance = {"space": "MNI152NLin2009aSym", "label_channels": ["GM", "WM"]}
    event = wire.decode_event(
        wire.encode_event(wire.result_event(SamplingResult(volumes, np.eye(4), request, provenance)))
    )
    decoded = wire.result_from_event(event, wire.decode_volumes(wire.encode_volumes(volumes)), "https://h:1")
    assert decoded.space == "MNI152NLin2009aSym" and decoded.label_names == ("GM", "WM")
    assert np.array_equal(decoded.volume(0), volumes[0, 0])
    assert np.array_equal(decoded.tissue_maps(0)["WM"], volumes[0, 2])
    event["provenance"]["label_channels"] = ["GM"]  # a server that names fewer maps than it sends channels
    with pytest.raises(wire.WireError, match="tissue maps"):
        wire.result_from_event(event, volumes, "https://h:1")


def _fill_the_queue(url: str, backend, timed: bool = False) -> None:
    """One job running (held at the gate) and one waiting: a queue of one place is full. ``timed``: one job
    has run first, so the server's waits are its time (milliseconds), not the guess of 60 s a job."""
    import httpx

    body = {"model": "tiny-pixel", "steps": 2}
    headers = {"Authorization": "Bearer s3cret"}
    if timed:
        backend.gate.set()
        run(RemoteBackend(url, token="s3cret").sample(SamplingRequest("tiny-pixel", steps=2)))
        backend.gate.clear()
        backend.started.clear()
    assert httpx.post(f"{url}/jobs", json=body, headers=headers, timeout=30).status_code == 200
    deadline = time.monotonic() + 30
    while not backend.started.is_set():
        assert time.monotonic() < deadline, "the first job never started"
        time.sleep(0.02)
    assert httpx.post(f"{url}/jobs", json=body, headers=headers, timeout=30).status_code == 200


@pytest.mark.slow
def test_the_client_waits_as_a_full_queue_says_then_runs_its_job(registry):
    """Before: a full queue's 429 ended the client at once ("try again in about 5 s", exit 5)."""
    from engine.server import ServerLimits
    from engine.testing import InstantBackend
    from tests.engine.server.gated import GatedBackend

    backend = GatedBackend(InstantBackend(registry))
    app = create_app(backend, token="s3cret", limits=ServerLimits(max_queued_jobs=1, max_queued_per_client=1))
    try:
        with ServerThread(app) as url:
            _fill_the_queue(url, backend, timed=True)  # a place frees within a second, it says
            waiting = RemoteBackend(url, token="s3cret", queue_wait_s=60).sample(
                SamplingRequest(model="tiny-pixel", steps=2, seed=1)
            )
            told = next(waiting)  # the queue is full: told, and waiting
            assert (
                told.stage == "load" and "trying again in" in told.message and "60 s in all" in told.message
            )
            backend.gate.set()
            assert run(waiting) is not None  # it got in once the queue moved
    finally:
        backend.gate.set()


def test_a_client_that_waited_its_deadline_says_so(registry):
    from engine.server import ServerLimits
    from engine.testing import InstantBackend
    from tests.engine.server.gated import GatedBackend

    backend = GatedBackend(InstantBackend(registry))
    app = create_app(backend, token="s3cret", limits=ServerLimits(max_queued_jobs=1, max_queued_per_client=1))
    try:
        with ServerThread(app) as url:
            _fill_the_queue(url, backend)
            client = RemoteBackend(url, token="s3cret", queue_wait_s=1)
            with pytest.raises(BackendUnavailable, match=r"gave up after waiting \d+ s.*--queue-wait 1"):
                run(client.sample(SamplingRequest(model="tiny-pixel", steps=2, seed=1)))
    finally:
        backend.gate.set()


# -- a place in the queue, and the clients' deadline (issue 50, point 3) ---------------------------------------


def _until(predicate, what: str) -> None:
    deadline = time.monotonic() + 60
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_queued_job_shows_its_place_and_the_clients_deadline(registry):
    """Before: a queued job's client was told "queued" and nothing more, however long the line."""
    from engine.server import ServerLimits
    from engine.testing import InstantBackend
    from tests.engine.server.gated import GatedBackend

    backend = GatedBackend(InstantBackend(registry))
    app = create_app(backend, token="s3cret", limits=ServerLimits(max_queued_jobs=4))
    try:
        with ServerThread(app) as url:
            _fill_the_queue(url, backend)  # one job running, one waiting
            waiting = RemoteBackend(url, token="s3cret", queue_wait_s=600).sample(
                SamplingRequest(model="tiny-pixel", steps=2, seed=1)
            )
            told = next(waiting)
            # nothing has run here: 60 s a job, the running one's and the one ahead's
            assert told.stage == "load" and told.message.startswith("queued, 2nd in line, about 2 min; ")
            assert "; waiting up to 600 s for the line to move, until " in told.message
            backend.gate.set()
            assert run(waiting) is not None
            # an idle server starts a job at once: a client that waits for nothing (0 s) still gets it
            assert run(
                RemoteBackend(url, token="s3cret", queue_wait_s=0).sample(SamplingRequest("tiny-pixel"))
            )
    finally:
        backend.gate.set()


def test_a_job_whose_line_does_not_move_by_the_clients_deadline_is_cancelled_and_said(registry):
    from engine.server import ServerLimits
    from engine.testing import InstantBackend
    from tests.engine.server.gated import GatedBackend

    backend = GatedBackend(InstantBackend(registry))
    app = create_app(backend, token="s3cret", limits=ServerLimits(keepalive_s=0.05))
    try:
        with ServerThread(app) as url:
            _fill_the_queue(url, backend)
            client = RemoteBackend(url, token="s3cret", queue_wait_s=0.5)
            with pytest.raises(
                BackendUnavailable,
                match=r"the engine server's line did not move for \d+ s \(queued, 2nd in line, about 2 min\), the "
                r"most this client waits for it \(--queue-wait 0.5\); the job was cancelled",
            ):
                run(client.sample(SamplingRequest(model="tiny-pixel", steps=2, seed=1)))
            assert app.state.manager.queued == 1  # its own job left the line; the other one waits on
    finally:
        backend.gate.set()


def test_four_clients_with_three_jobs_each_all_get_their_results(registry):
    """The report: 4 clients x 3 small jobs at once against a queue of 8; `generate --server` ended at once
    on the 429 ("try again in about 5 s", exit 5) while raw clients that honoured Retry-After got all 12.
    Here the first job is held until every submit is in: 1 runs, 8 wait in line and are told their places,
    3 are told the queue is full and wait as it says; then all 12 finish."""
    from collections import defaultdict

    from engine.server import new_token
    from engine.testing import InstantBackend
    from tests.engine.server.gated import GatedBackend

    tokens = {f"client-{i}": new_token() for i in range(4)}
    backend = GatedBackend(InstantBackend(registry))
    app = create_app(backend, token=tokens)
    manager = app.state.manager
    told: dict[tuple[str, int], list[str]] = defaultdict(list)
    results = {}

    def submit(name: str, seed: int) -> None:
        client = RemoteBackend(url, token=tokens[name])
        request = SamplingRequest(model="tiny-pixel", steps=2, seed=seed)
        results[name, seed] = run(
            client.sample(request), on_progress=lambda p: told[name, seed].append(p.message)
        )

    def clients_told(start: str) -> int:
        return sum(any(m.startswith(start) for m in messages) for messages in list(told.values()))

    try:
        with ServerThread(app) as url:
            backend.gate.set()
            run(RemoteBackend(url, token=tokens["client-0"]).sample(SamplingRequest("tiny-pixel", steps=2)))
            backend.gate.clear()  # the server has timed a job: its waits are that job's time, not a guess
            clients = [
                threading.Thread(target=submit, args=(name, seed)) for name in tokens for seed in range(3)
            ]
            for thread in clients:
                thread.start()
            # every job in line but the next to start is told its place; 3 clients are told the queue is full
            _until(
                lambda: (
                    manager.queued == 8 and clients_told("queued, ") >= 7 and clients_told("the engine") == 3
                ),
                "1 running, 8 in line and told their places, 3 told to wait",
            )
            backend.gate.set()
            for thread in clients:
                thread.join(60)
        assert sorted(results) == sorted((name, seed) for name in tokens for seed in range(3))
        assert all(result is not None and result.volumes.shape[0] == 1 for result in results.values())
    finally:
        backend.gate.set()


def _sample_in_thread(remote: RemoteBackend, request: SamplingRequest) -> tuple[threading.Thread, list]:
    """Iterate ``remote.sample(request)`` in a thread; what ended it is appended to the returned list."""
    ended: list = []

    def consume():
        try:
            run(remote.sample(request))
            ended.append("finished")
        except Exception as exc:  # the test reads what ended it
            ended.append(exc)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    return thread, ended


def _wait_for(condition, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen"
        time.sleep(0.02)


def _wait_streaming(remote: RemoteBackend, held) -> None:
    """Until the held job has started on the server and the client reads its event stream."""
    _wait_for(held.started.is_set, "the job's start")
    _wait_for(lambda: any(stream is not None for stream in remote._open_jobs.values()), "the event stream")


@pytest.fixture
def held_server(backend):
    """An engine server whose jobs wait at their start until the test opens ``gate``."""
    from tests.engine.server.gated import GatedBackend

    held = GatedBackend(backend)
    app = create_app(held, token="s3cret")
    with ServerThread(app) as url:
        yield url, app, held
    held.gate.set()


def test_closing_the_backend_while_its_job_runs_cancels_the_job_on_the_server(held_server):
    # The window's Quit abandons a stuck run in a thread of its own and closes the connection at once; when the
    # close came first, the closed client never sent the cancel and the job stayed on the shared server.
    url, app, held = held_server
    remote = RemoteBackend(url, token="s3cret")
    thread, ended = _sample_in_thread(remote, SamplingRequest(model="tiny-latent", steps=2))
    _wait_streaming(remote, held)

    remote.close()
    assert not app.state.manager.jobs  # told before close returned
    thread.join(30)
    assert len(ended) == 1 and isinstance(ended[0], Cancelled)
    remote.abandon()  # a late abandon (the window's thread) after the close is harmless


def _refusing_deletes(app, answers: list[tuple[int, dict[str, str]]]):
    """``app`` behind a front that answers the first DELETEs with ``answers`` (status, headers), in turn."""

    async def front(scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "DELETE" and answers:
            status, headers = answers.pop(0)
            encoded = [(name.encode(), value.encode()) for name, value in headers.items()]
            await send({"type": "http.response.start", "status": status, "headers": encoded})
            await send({"type": "http.response.body", "body": b'{"detail": "not now"}'})
            return
        await app(scope, receive, send)

    return front


@pytest.mark.parametrize(
    ("answers", "warning"),
    [
        ([(503, {"retry-after": "0.1"}), (429, {"retry-after": "0.1"})], None),  # busy twice, then it cancels
        ([(500, {})], "it answered 500"),  # refused: said, not silent
    ],
)
def test_abandoning_a_job_retries_a_busy_server_and_says_when_it_was_not_told(
    backend, caplog, answers, warning
):
    from tests.engine.server.gated import GatedBackend

    held = GatedBackend(backend)
    app = create_app(held, token="s3cret")
    pending = list(answers)  # given in turn; the parameter itself stays whole for a repeat of this test
    with ServerThread(_refusing_deletes(app, pending)) as url:
        remote = RemoteBackend(url, token="s3cret")
        thread, ended = _sample_in_thread(remote, SamplingRequest(model="tiny-latent", steps=2))
        _wait_streaming(remote, held)
        with caplog.at_level("WARNING", logger="engine.backends.remote"):
            remote.abandon()
        thread.join(30)
        assert len(ended) == 1 and isinstance(ended[0], Cancelled)
        assert not pending  # every scripted answer was given
        assert bool(app.state.manager.jobs) is (warning is not None)
        warned = [r.getMessage() for r in caplog.records if "was not told to cancel" in r.getMessage()]
        assert len(warned) == (warning is not None) and all(warning in text for text in warned)
        held.gate.set()
        remote.close()
