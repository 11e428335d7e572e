"""Every registered sampler passes one common suite (as diffusers' ``SchedulerCommonTest``): a new sampler is its
adapter, registered, and inherits these tests; the made-up sampler of ``tests/made_up_sampler.py`` runs them too,
registered for the test alone."""

from __future__ import annotations

import inspect

import pytest
import torch

from engine import sampling
from engine.api import SamplingRequest, run
from engine.models.networks import build_sampler
from engine.optimization.apply import OptimizationConfig, prepare
from engine.samplers import FAMILIES, family_of, sampler_adapter, sampler_names, samplers_of
from engine.testing import build_tiny_networks, tiny_spec
from tests.made_up_sampler import HandWrittenDDIM

SAMPLERS = [*sampler_names(), HandWrittenDDIM.name]
SHAPE = (2, 3, 4, 6, 4)  # batch, channels, x, y, z
STEPS = 5


@pytest.fixture(params=SAMPLERS)
def sampler(request) -> str:
    """Each registered sampler, and the test's own registered for the test."""
    if request.param == HandWrittenDDIM.name:
        request.getfixturevalue("made_up_sampler")
    return request.param


def _spec(name: str, kind: str = "pixel"):
    """A tiny model trained for ``name``'s family, with ``name`` as its default sampler."""
    return tiny_spec(kind=kind, conditioned=False, samplers=(name,))


def _model_output(seed: int) -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed))


def _run_steps(name: str, seed: int = 0) -> list[torch.Tensor]:
    """The samples of a whole run of a fresh adapter on fixed model outputs."""
    adapter = build_sampler(name, _spec(name).schedule)
    adapter.set_timesteps(STEPS, torch.device("cpu"), SHAPE)
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(SHAPE, generator=generator)
    timesteps = adapter.timesteps
    samples = []
    for i, t in enumerate(timesteps):
        next_t = timesteps[i + 1] if i + 1 < len(timesteps) else torch.tensor(0)
        x = adapter.step(_model_output(i), t, next_t, x, generator).sample
        samples.append(x)
    return samples


def test_it_is_registered_with_a_name_a_family_and_a_title(sampler):
    adapter = sampler_adapter(sampler)
    assert adapter.name == sampler and adapter.title
    assert family_of(sampler) in FAMILIES
    assert sampler in samplers_of(family_of(sampler))


def test_a_model_of_its_family_offers_it(sampler):
    for name in samplers_of(family_of(sampler)):
        assert sampler in _spec(name).samplers  # every model of the family, whichever its default
    other = [f for f in FAMILIES if f != family_of(sampler) and samplers_of(f)]
    for family in other:
        assert sampler not in _spec(samplers_of(family)[0]).samplers


def test_set_timesteps_gives_the_steps_first_to_last(sampler):
    adapter = build_sampler(sampler, _spec(sampler).schedule)
    adapter.set_timesteps(STEPS, torch.device("cpu"), SHAPE)
    timesteps = adapter.timesteps
    assert len(timesteps) == STEPS
    assert all(0 <= float(t) <= adapter.num_train_timesteps for t in timesteps)  # a flow starts at pure noise
    assert all(float(a) > float(b) for a, b in zip(timesteps, timesteps[1:], strict=False))  # noisy to clean


def test_a_step_gives_the_next_sample_and_its_clean_estimate(sampler):
    adapter = build_sampler(sampler, _spec(sampler).schedule)
    adapter.set_timesteps(STEPS, torch.device("cpu"), SHAPE)
    x, output = torch.randn(SHAPE), _model_output(1)
    t, next_t = adapter.timesteps[0], adapter.timesteps[1]
    stepped = adapter.step(output, t, next_t, x, torch.Generator().manual_seed(0))
    for tensor in (stepped.sample, stepped.x0):
        assert tensor.shape == SHAPE and tensor.dtype == x.dtype and bool(torch.isfinite(tensor).all())
    assert not torch.equal(stepped.sample, x)
    # the estimate a step hands over is the one the adapter states for previews
    assert torch.allclose(stepped.x0, adapter.estimate_x0(output, t, x), atol=1e-5)


def test_the_same_seed_gives_the_same_run_and_a_fresh_adapter_keeps_no_state(sampler):
    first, second = _run_steps(sampler, seed=4), _run_steps(sampler, seed=4)
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))


def test_it_samples_a_tiny_model_through_the_one_loop(sampler):
    class Loaded:
        def __init__(self, nets):
            self.unet, self.autoencoder = nets["unet"], nets.get("autoencoder")

    spec = _spec(sampler, kind="latent")
    prepared = prepare(Loaded(build_tiny_networks(spec, seed=2)), OptimizationConfig(), torch.device("cpu"))
    request = SamplingRequest(model=spec.id, sampler=sampler, steps=3, seed=5, preview_interval=1)
    events = []
    out = run(sampling.denoise(prepared, spec, request, torch.device("cpu")), events.append)
    assert out.request.sampler == sampler and out.scheduler_config["sampler"] == sampler
    assert out.volumes.shape == (1, *spec.output_shape) and bool(torch.isfinite(out.volumes).all())
    previews = [e.preview for e in events if e.stage == "denoise"]
    # the first due preview is always made (later ones may be skipped while previews cost too much of the run)
    assert previews[1] is not None and previews[1].shape == spec.output_shape[1:]
    assert previews[0] is None and previews[-1] is None


def test_the_loop_never_names_a_sampler():
    """The loop asks the adapter, never which sampler runs: no registered name appears in its code."""
    source = inspect.getsource(sampling)
    assert [name for name in sampler_names() if f'"{name}"' in source or f"'{name}'" in source] == []
