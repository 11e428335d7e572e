"""The engine server under abuse, against a real uvicorn server on 127.0.0.1 (issue 18, "Server").

Each test here fails on the server before the hardening: streams that never ended, a thread per stream and
per job, unbounded bodies and queues, no TLS, paths accepted as models, 5xx for malformed bodies.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import httpx
import numpy as np
import pytest

from engine.api import SamplingRequest, run
from engine.backends.local import LocalBackend
from engine.backends.remote import RemoteBackend
from engine.errors import BackendUnavailable, InvalidRequest, ModelNotFound
from engine.server import JobRequest, OptimizationBody, ServerLimits, create_app
from engine.testing import InstantBackend, ServerThread
from tests.engine.server.gated import GatedBackend

TOKEN = "k" * 10 + "-test-token-for-the-hardening-tests-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {"Content-Type": "application/json", **AUTH}


@pytest.fixture
def local(registry):
    return LocalBackend("cpu", registry)


@pytest.fixture
def gated(registry):
    backend = GatedBackend(InstantBackend(registry))  # the HTTP layer is under test here, not sampling
    yield backend
    backend.gate.set()  # never leave a job waiting


def _wait(predicate, timeout_s=60.0, what="the condition"):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _submit(client: httpx.Client, **fields) -> httpx.Response:
    body = {"model": "tiny-pixel", "steps": 2, **fields}
    return client.post("/jobs", content=json.dumps(body), headers=JSON)


# -- every stream ends ---------------------------------------------------------------------------------------


def test_a_finished_jobs_stream_with_since_past_the_end_closes_at_once(local):
    app = create_app(local, token=TOKEN)
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        job_id = _submit(client).json()["id"]
        job = app.state.manager.get(job_id)
        _wait(lambda: job.done, what="the job to finish")
        count = len(job.events)
        for since in (count, count + 5, 10**6):
            # Before: this request never sent and never closed (the read timed out here).
            response = client.get(f"/jobs/{job_id}/events", params={"since": since}, headers=AUTH)
            assert response.status_code == 200 and response.text == ""
        whole = client.get(f"/jobs/{job_id}/events", headers=AUTH).text.splitlines()
        assert len(whole) == count and json.loads(whole[-1])["type"] == "result"
        assert app.state.streams["open"] == 0


@pytest.mark.slow
def test_200_open_event_streams_leave_the_server_answering(gated):
    app = create_app(gated, token=TOKEN)
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        job_id = _submit(client).json()["id"]
        _wait(gated.started.is_set, what="the job to start")
        request = (
            f"GET /jobs/{job_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
        ).encode()
        host, port = url.removeprefix("http://").split(":")
        sockets = []
        try:
            for i in range(200):  # from 4 addresses: one address has a share of the streams (issue 50)
                sock = socket.create_connection(
                    (host, int(port)), timeout=60, source_address=(f"127.0.3.{1 + i % 4}", 0)
                )
                sock.sendall(request)
                sockets.append(sock)
            _wait(lambda: app.state.streams["open"] == 200, what="200 open streams")
            # Before: 40 blocked streams took every worker thread and nothing answered, not even 401s.
            assert client.get("/info", headers=AUTH).json()["device"] == "cpu"
            assert client.get("/info").status_code == 401
            assert threading.active_count() < 100  # streams hold no threads
            gated.gate.set()
            for sock in sockets:  # every stream ends with the job's result
                data = b""
                while not data.endswith(b"0\r\n\r\n"):
                    chunk = sock.recv(65536)
                    assert chunk, "a stream closed before its terminal event"
                    data += chunk
                assert b'"type":"result"' in data
        finally:
            for sock in sockets:
                sock.close()
        _wait(lambda: app.state.streams["open"] == 0, what="the streams to be closed")


def test_quiet_streams_send_keepalives_then_end_and_the_client_resumes(gated):
    limits = ServerLimits(keepalive_s=0.1, stream_idle_s=0.3)
    app = create_app(gated, token=TOKEN, limits=limits)
    with ServerThread(app) as url:
        with httpx.Client(base_url=url, timeout=30) as client:
            job_id = _submit(client).json()["id"]
            lines = client.get(f"/jobs/{job_id}/events", headers=AUTH).text.splitlines()
        kinds = [json.loads(line)["type"] for line in lines]
        assert kinds[0] == "queued" and "keepalive" in kinds and kinds[-1] == "reconnect"
        assert json.loads(lines[-1])["since"] == 1  # where to resume: after the one stored event
        # The remote client follows reconnects until the result arrives.
        remote = RemoteBackend(url, token=TOKEN)
        opened = app.state.streams["opened"]
        job = remote.sample(SamplingRequest(model="tiny-pixel", steps=2, seed=4))
        result = {}
        worker = threading.Thread(target=lambda: result.setdefault("r", run(job)))
        worker.start()
        _wait(lambda: app.state.streams["opened"] >= opened + 3, what="the client to reconnect")
        gated.gate.set()
        worker.join(60)
        assert result["r"].provenance["backend"] == "remote" and result["r"].volumes.shape[0] == 1


# -- bounded work ---------------------------------------------------------------------------------------------


def test_a_full_queue_is_answered_429_with_retry_after(gated):
    app = create_app(gated, token=TOKEN, limits=ServerLimits(max_queued_jobs=2))
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        first = _submit(client).json()["id"]
        _wait(gated.started.is_set, what="the first job to start")
        assert _submit(client).status_code == 200 and _submit(client).status_code == 200  # two wait
        refused = _submit(client)
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
        assert refused.json()["error_class"] == "BackendUnavailable"
        # A client told not to wait (--queue-wait 0) says so at once; others wait as Retry-After says (test_remote).
        with pytest.raises(BackendUnavailable, match="busy; try again in"):
            backend = RemoteBackend(url, token=TOKEN, queue_wait_s=0)
            run(backend.sample(SamplingRequest(model="tiny-pixel", steps=2)))
        # Before: a thread per job. Now one worker runs them in turn.
        workers = [t for t in threading.enumerate() if t.name == "engine-job-worker"]
        assert len(workers) == 1 and len(app.state.manager.jobs) == 3
        # Cancelling a waiting job frees its place at once.
        waiting = [j for j in app.state.manager.jobs.values() if j.id != first]
        assert client.delete(f"/jobs/{waiting[0].id}", headers=AUTH).status_code == 200
        assert waiting[0].events[-1]["type"] == "cancelled"
        assert client.get(f"/jobs/{waiting[0].id}/events", headers=AUTH).status_code == 404  # forgotten
        assert _submit(client).status_code == 200
        gated.gate.set()
        _wait(lambda: all(j.done for j in app.state.manager.jobs.values()), what="the jobs to finish")
        _wait(
            lambda: not any(t.name == "engine-job-worker" for t in threading.enumerate()), what="worker exit"
        )


def test_a_body_over_the_limit_is_answered_413_before_parsing(local):
    app = create_app(local, token=TOKEN, limits=ServerLimits(max_body_bytes=4096))
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        big = json.dumps({"model": "tiny-pixel", "conditioning": {"x" * 60: 1.0}, "pad": "y" * 100_000})
        response = client.post("/jobs", content=big, headers=JSON)
        assert response.status_code == 413 and "over 4096 bytes" in response.json()["detail"]
        assert len(response.content) < 500  # nothing echoed back

        def chunks():  # no Content-Length: the limit counts what arrives
            for _ in range(10):
                yield b" " * 1000

        assert client.post("/jobs", content=chunks(), headers=JSON).status_code == 413
        assert not app.state.manager.jobs
        assert _submit(client).status_code == 200  # a normal request still passes


# -- tokens ---------------------------------------------------------------------------------------------------


def test_repeated_wrong_tokens_are_answered_ever_more_slowly(local):
    limits = ServerLimits(auth_free_failures=2, auth_base_delay_s=0.01, auth_max_delay_s=0.04)
    app = create_app(local, token=TOKEN, limits=limits)
    gate = app.state.gate
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        for _ in range(6):
            assert client.get("/info", headers={"Authorization": "Bearer guess"}).status_code == 401
        assert list(gate.delays) == [0.0, 0.0, 0.01, 0.02, 0.04, 0.04]
        assert gate.failures["127.0.0.1"][0] == 6 and gate.total_failures == 6
        # the right token is let in at once, and does not wipe the guesser's count at its address
        assert client.get("/info", headers=AUTH).status_code == 200
        assert gate.failures["127.0.0.1"][0] == 6
        # no token, or another scheme, guesses nothing: 401 at once, not counted
        for headers in ({}, {"Authorization": f"Basic {TOKEN}"}, {"Authorization": "Bearer"}):
            assert client.get("/info", headers=headers).status_code == 401
        assert gate.total_failures == 6 and gate.not_bearer == 3


def test_the_schema_needs_the_token_and_there_is_no_docs_page(local):
    with ServerThread(create_app(local, token=TOKEN)) as url, httpx.Client(base_url=url, timeout=30) as c:
        assert c.get("/openapi.json").status_code == 401
        assert c.get("/openapi.json", headers=AUTH).status_code == 200
        assert c.get("/docs", headers=AUTH).status_code == 404  # a CDN page that could not send the token
        schema = c.get("/openapi.json", headers=AUTH).json()
        body = schema["paths"]["/jobs"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body["$ref"].endswith("/JobRequest")
        assert set(schema["components"]["schemas"]["JobRequest"]["properties"]["model"]["enum"]) == {
            "tiny-latent",
            "tiny-pixel",
            "tiny-rflow",
        }
    with ServerThread(create_app(local)) as url:  # no token: this machine only, open
        assert httpx.get(url + "/openapi.json", timeout=30).status_code == 200


def test_the_wire_schema_has_every_request_field():
    from engine.api.optimization_config import OptimizationConfig

    assert set(JobRequest.model_fields) == set(SamplingRequest.__dataclass_fields__)
    assert set(OptimizationBody.model_fields) == set(OptimizationConfig.__dataclass_fields__)
    full = SamplingRequest(model="m", steps=3, conditioning={"a": 1.0}, guidance_scale=2.0)
    assert SamplingRequest.from_dict(JobRequest.model_validate_json(full.to_json()).model_dump()) == full


def test_network_binds_need_a_long_token_and_tls(capsys):
    from engine.cli import main
    from engine.server import check_bind

    assert main(["serve", "--new-token"]) == 0
    token = capsys.readouterr().out.strip()
    assert main(["serve", "--new-token"]) == 0
    assert len(token) >= 43 and token != capsys.readouterr().out.strip()
    check_bind("127.0.0.1", None, tls=False)  # this machine only: no token needed
    check_bind("0.0.0.0", token, tls=True)
    with pytest.raises(InvalidRequest, match="needs a token"):
        check_bind("0.0.0.0", None, tls=True)
    with pytest.raises(InvalidRequest, match="too easy to guess"):
        check_bind("0.0.0.0", "x", tls=True)
    with pytest.raises(InvalidRequest, match="without TLS"):
        check_bind("10.1.2.3", token, tls=False)
    check_bind("10.1.2.3", token, tls=False, allow_plain_http=True)
    # The CLI refuses before it binds anything.
    assert main(["serve", "--host", "0.0.0.0", "--token", "short", "--port", "1"]) == 2
    assert "volsynth serve --new-token" in capsys.readouterr().err


# -- TLS ------------------------------------------------------------------------------------------------------


@pytest.fixture
def tls_files(tmp_path):
    from engine.server import certificate_file_fingerprint, self_signed_certificate

    cert, key = self_signed_certificate(tmp_path / "tls", ["127.0.0.1"])
    return cert, key, certificate_file_fingerprint(cert)


@pytest.mark.slow
def test_self_signed_tls_with_a_pinned_fingerprint(local, tls_files, tmp_path, capsys):
    import argparse

    from engine.cli.serve import tls_files as serve_tls_files

    cert, key, fingerprint = tls_files
    # `volsynth serve --tls-self-signed` prints the fingerprint and keeps the certificate between starts.
    args = argparse.Namespace(
        tls_self_signed=True,
        tls_dir=str(tmp_path / "tls"),
        host="0.0.0.0",
        port=8765,
        tls_cert=None,
        tls_key=None,
    )
    assert serve_tls_files(args) == (str(cert), str(key))
    assert fingerprint in capsys.readouterr().out
    assert (key.stat().st_mode & 0o777) == 0o600

    app = create_app(local, token=TOKEN)
    with ServerThread(app, ssl_certfile=cert, ssl_keyfile=key) as url:
        assert url.startswith("https://")
        remote = RemoteBackend(url, token=TOKEN, fingerprint=fingerprint.lower().replace(":", ""))
        request = SamplingRequest(model="tiny-pixel", steps=2, seed=5)
        result = run(remote.sample(request))
        assert np.array_equal(result.volumes, run(local.sample(request)).volumes)

        wrong = "AB:" * 31 + "AB"
        with pytest.raises(BackendUnavailable, match="not the pinned AB:AB.*Nothing was sent"):
            RemoteBackend(url, token=TOKEN, fingerprint=wrong).info()
        with pytest.raises(BackendUnavailable, match="does not trust.*pin the fingerprint"):
            RemoteBackend(url, token=TOKEN).info()
        assert app.state.gate.total_failures == 0  # the refused clients never sent a request
    with pytest.raises(InvalidRequest, match="64 hex digits"):
        RemoteBackend("https://127.0.0.1:1", fingerprint="12:34")


@pytest.mark.slow
def test_cli_generate_pins_the_server_fingerprint(local, tls_files, tmp_path, capsys):
    from engine.cli import main

    cert, key, fingerprint = tls_files
    with ServerThread(create_app(local, token=TOKEN), ssl_certfile=cert, ssl_keyfile=key) as url:
        base = ["generate", "--server", url, "--token", TOKEN, "--model", "tiny-pixel", "--steps", "2"]
        out = tmp_path / "pinned.nii.gz"
        assert main([*base, "--server-fingerprint", fingerprint, "--out", str(out)]) == 0
        assert out.is_file()
        assert main([*base, "--server-fingerprint", "00" * 32, "--out", str(tmp_path / "x.nii.gz")]) == 5
        assert "not the pinned" in capsys.readouterr().err


@pytest.mark.parametrize("url", ["http://gpu-box:8765", "http://10.0.0.5:8765", "http://[2001:db8::1]:8765"])
def test_the_client_never_sends_a_token_over_plain_http_to_another_machine(url):
    with pytest.raises(InvalidRequest, match="refusing to send the token in clear over http://"):
        RemoteBackend(url, token=TOKEN)
    RemoteBackend(url).close()  # no token: nothing secret to send
    with pytest.raises(InvalidRequest, match="pins an https server"):
        RemoteBackend(url, fingerprint="AB" * 32)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8765", "http://localhost:8765", "http://[::1]:8765"])
def test_a_token_over_plain_http_to_this_machine_is_allowed(url):
    RemoteBackend(url, token=TOKEN).close()  # an SSH tunnel ends here


def test_cli_refuses_a_plain_http_token_to_another_machine(capsys):
    from engine.cli import main

    assert main(["generate", "--server", "http://gpu-box:8765", "--token", TOKEN, "--out", "x.nii.gz"]) == 2
    assert "refusing to send the token" in capsys.readouterr().err


# -- requests -------------------------------------------------------------------------------------------------


def test_models_are_registered_ids_never_paths_and_errors_do_not_reveal_paths(
    local, tiny_models_dir, tmp_path
):
    app = create_app(local, token=TOKEN)
    existing = str(tiny_models_dir / "tiny-pixel")  # a real model folder on the server
    missing = str(tmp_path / "no-such-folder")
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        answers = {}
        for name, model in (("existing", existing), ("missing", missing), ("unknown", "not-a-model")):
            response = _submit(client, model=model)
            assert response.status_code == 422 and response.json()["error_class"] == "ModelNotFound"
            answers[name] = re.sub(r"id '[^']*'", "id X", response.json()["detail"])  # the name as sent
        assert answers["existing"] == answers["missing"] == answers["unknown"]
        assert "tiny-pixel" in answers["existing"] and "never a path" in answers["existing"]
        assert not app.state.manager.jobs  # nothing ran
        with pytest.raises(ModelNotFound, match="runs its registered models only"):
            run(RemoteBackend(url, token=TOKEN).sample(SamplingRequest(model=existing)))


NESTED = "[" * 20_000 + "]" * 20_000
MALFORMED = [
    "[]",
    '"a job"',
    "1",
    "null",
    "{",
    "not json at all",
    NESTED,
    '{"conditioning": {"a": ' + NESTED + "}}",
    '{"model": ' + "{" * 5000 + "}" * 5000 + "}",
    '{"model": 5}',
    '{"steps": "5"}',
    '{"steps": 5.5}',
    '{"steps": true}',
    '{"steps": -1}',
    '{"seed": -1}',
    '{"seed": ' + "9" * 4000 + "}",
    '{"seed": 1e999}',
    '{"seed": 9223372036854775808}',  # 2^63: the first seed past the bound
    '{"seed": 9223372036854775999}',  # past it, though it rounds to 2^63 as a float
    '{"xla_plan": "dp"}',
    '{"guidance_scale": NaN}',
    '{"guidance_scale": Infinity}',
    '{"conditioning": []}',
    '{"conditioning": {"a": "b"}}',
    '{"conditioning": {"": 1}}',
    '{"optimization": []}',
    '{"optimization": {"autocast": "fp64"}}',
    '{"optimization": {"quantization": "int8", "autocast": "fp16"}}',
    '{"sampler": "euler"}',
    '{"batch_size": 0}',
    '{"bogus": 1}',
]


def test_malformed_bodies_are_4xx_never_5xx(local):
    app = create_app(local, token=TOKEN)
    with ServerThread(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        for body in MALFORMED:
            response = client.post("/jobs", content=body, headers=JSON)
            assert 400 <= response.status_code < 500, (body[:60], response.status_code, response.text[:200])
            assert len(response.content) < 1000  # one short message, no echo of the body
        raw = client.post("/jobs", content=b"\xff\xfe\x00garbage", headers=JSON)
        assert 400 <= raw.status_code < 500
        for path, params in (("/jobs/zzz/events", {}), (f"/jobs/{'0' * 32}/events", {"since": -1})):
            assert client.get(path, params=params, headers=AUTH).status_code == 422
        assert client.get(f"/jobs/{'0' * 32}/events", headers=AUTH).status_code == 404
        assert not app.state.manager.jobs


def test_a_registry_that_cannot_be_listed_is_a_503_not_a_500(registry):
    class BrokenRegistry:
        def list(self):
            raise RecursionError("a deeply nested spec.json")

    backend = InstantBackend(registry)
    backend.registry = BrokenRegistry()
    with ServerThread(create_app(backend, token=TOKEN)) as url, httpx.Client(base_url=url, timeout=30) as c:
        for response in (c.get("/models", headers=AUTH), _submit(c)):
            assert response.status_code == 503 and "cannot list its models" in response.json()["detail"]
        assert c.get("/openapi.json", headers=AUTH).status_code == 200
