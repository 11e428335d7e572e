"""A short schemathesis fuzz of the engine server (a real uvicorn server on 127.0.0.1).

Every operation in the OpenAPI schema gets generated requests, valid and invalid, and every answer is
checked against the schema: no 5xx, documented status codes, bodies as described, schema-violating
requests refused. The stateful run follows the schema's links (submit -> events/volumes/cancel) on real
job ids. The long run (5+ minutes) is ``python -m tests.engine.fuzz_server`` (next to this file).
"""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, settings  # noqa: E402  (after the optional import)

from engine.models.registry import ModelRegistry  # noqa: E402
from engine.server import ServerLimits, create_app  # noqa: E402
from engine.testing import InstantBackend, ServerThread  # noqa: E402

TOKEN = "fuzz-" + "t" * 20 + "0123456789abcdefghijklmnop"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FAST = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,  # the same cases on every run: a failure here is reproducible
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate],
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from engine.testing import make_tiny_model

    root = tmp_path_factory.mktemp("fuzz-models")
    make_tiny_model(root / "tiny-pixel", model_id="tiny-pixel", kind="pixel", conditioned=False)
    # schemathesis's ignored_auth check re-sends cases with a made-up token: every such wrong guess is
    # answered at once here, since the back-off (tested in test_server_tokens.py) would only slow the run.
    # The stateful run makes more jobs than a client's 16 kept results: its own newest would evict the
    # oldest (tested in test_server_jobs_owned.py) and schemathesis would read that as a created job lost.
    limits = ServerLimits(auth_free_failures=10**9, finished_jobs_kept=10**6)
    app = create_app(InstantBackend(ModelRegistry([root])), token=TOKEN, limits=limits)
    with ServerThread(app) as url:
        yield url, app


@pytest.fixture(scope="module")
def api_schema(server):
    url, _ = server
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=AUTH, timeout=30)

    @schema.hook
    def filter_body(ctx, body):
        # The generator turns the seed's integer bound (exclusiveMaximum 2^63) into a float maximum, which
        # rounds to 2^63 itself, and then draws seeds such as 2^63 + 191 as "valid"; the server is right to
        # refuse those. Seeds below the bound stay in.
        seed = body.get("seed") if isinstance(body, dict) else None
        return not (isinstance(seed, int | float) and not isinstance(seed, bool) and seed >= 2**63)

    return schema


def _headers_made_invalid(case) -> bool:
    """Negative mode also makes the declared bearer credentials invalid (made up, or left out): such a
    case must go as made, for the token gate to refuse it; adding the token would make it a valid case."""
    from schemathesis import GenerationMode

    header = (case.meta.components if case.meta else {}).get("header")
    return header is not None and header.mode == GenerationMode.NEGATIVE


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_generated_requests_get_documented_answers_and_never_5xx(api_schema, mode):
    from hypothesis import given
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/info", "/jobs", "/jobs/{job_id}/events", "/plan"}
    if mode == "positive":
        # A valid /plan request compiles XLA programs for seconds to minutes: 40 of them do not fit a test
        # run. Its refusals are fuzzed in negative mode; real plans are tested in tests/engine/xla.
        operations = [op for op in operations if op.path != "/plan"]
    answers = []
    for operation in operations:

        @FAST
        @given(case=operation.as_strategy(generation_mode=GenerationMode(mode)))
        def check(case):
            if _headers_made_invalid(case):
                response = case.call_and_validate(timeout=30)
            else:
                response = case.call_and_validate(headers=AUTH, timeout=30)
            answers.append(response.status_code)

        try:
            check()
        except Unsatisfiable:  # nothing to make invalid (no parameters, no body): positive mode covers it
            assert mode == "negative"
    assert answers and max(answers) < 500
    if mode == "negative":
        assert min(answers) >= 400  # every schema-violating request was refused


@pytest.mark.slow
def test_stateful_fuzz_on_real_job_ids(api_schema, server):
    _, app = server

    class Workflow(api_schema.as_state_machine()):
        def get_call_kwargs(self, case):
            if _headers_made_invalid(case):  # the token is what is wrong here: send the case as made
                return {"timeout": 30}
            return {"headers": AUTH, "timeout": 30}

    Workflow.run(
        settings=settings(
            max_examples=15,
            stateful_step_count=6,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
    )
    assert app.state.streams["open"] == 0  # every stream the run opened has ended
