"""The sample body the local and XLA backends share (engine.backends.in_process): one resolve per run, one
model resident, the hooks each backend fills in."""

from __future__ import annotations

import pytest

from engine.api import SamplingRequest, run
from engine.backends.in_process import InProcessBackend, OneModelCache
from engine.backends.local import LocalBackend


def test_both_in_process_backends_share_the_one_sample_body():
    from engine.backends.xla import XlaBackend

    assert LocalBackend.sample is InProcessBackend.sample
    assert XlaBackend.sample is InProcessBackend.sample


def test_a_local_run_resolves_its_request_once(registry, monkeypatch):
    import engine.sampling

    calls = []
    real = engine.sampling.resolve_request

    def counting(spec, request):
        calls.append(request)
        return real(spec, request)

    monkeypatch.setattr("engine.sampling.resolve_request", counting)
    result = run(LocalBackend("cpu", registry).sample(SamplingRequest(model="tiny-pixel", steps=2)))
    assert len(calls) == 1
    assert result.request.steps == 2 and result.request.sampler  # the loop ran on the resolved request


def test_the_loop_resolves_a_request_itself_when_not_handed_one(registry):
    import torch

    from engine.optimization.apply import OptimizationConfig, prepare
    from engine.sampling import denoise

    source = registry.get("tiny-pixel")
    cpu = torch.device("cpu")
    prepared = prepare(source.load(), OptimizationConfig(), cpu, use_cache=False)
    loop = run(denoise(prepared, source.spec, SamplingRequest(steps=2), cpu))
    assert loop.request.model == source.spec.id and loop.request.steps == 2


def test_a_bad_request_fails_before_the_load(registry, monkeypatch):
    from engine.errors import InvalidRequest

    backend = LocalBackend("cpu", registry)
    built = []
    monkeypatch.setattr(backend, "_build", built.append)
    with pytest.raises(InvalidRequest, match="cannot exceed"):
        next(backend.sample(SamplingRequest(model="tiny-pixel", steps=5000)))
    assert built == []


class _Source:
    def __init__(self, path):
        self.path = path


def test_one_model_cache_keeps_one_model_and_reuses_it(tmp_path):
    cache, builds = OneModelCache(), []

    def build(source):
        builds.append(source.path.name)
        return object()

    a, b = _Source(tmp_path / "a"), _Source(tmp_path / "b")
    first = cache.get(a, build)
    assert cache.get(_Source(tmp_path / "a"), build) is first  # same folder: no second load
    cache.get(b, build)
    assert cache.get(a, build) is not first  # only one resident: a was dropped when b came
    assert builds == ["a", "b", "a"]


def test_local_provenance_keeps_its_records(registry):
    result = run(LocalBackend("cpu", registry).sample(SamplingRequest(model="tiny-latent", steps=2)))
    provenance = result.provenance
    assert provenance["backend"] == "local"
    assert provenance["device"] == "cpu"
    assert set(provenance["timings"]) >= {"load_s", "denoise_s", "decode_s", "total_s"}
    assert "report" in provenance["optimization"] and "requested" in provenance["optimization"]
