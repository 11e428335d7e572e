"""Step caching (engine/optimization/step_cache.py) through the one sampling loop, on a tiny U-Net."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.api import SamplingRequest, run
from engine.api.optimization_config import OptimizationConfig
from engine.errors import InvalidRequest
from engine.metrics.image import psnr
from engine.optimization.apply import PreparedModel, prepare
from engine.optimization.step_cache import StepCachedUNet, unet_levels
from engine.sampling import CURRENT_STEP, StepIndex, denoise


def _loop(prepared, spec, steps=4, seed=1, guidance=2.0):
    request = SamplingRequest(steps=steps, seed=seed, guidance_scale=guidance)
    return run(denoise(prepared, spec, request, torch.device("cpu"))).volumes


def _cached(tiny_loaded, cpu, interval=3, level=1):
    config = OptimizationConfig(step_cache_interval=interval, step_cache_level=level)
    return prepare(tiny_loaded, config, cpu, use_cache=False)


@pytest.mark.slow
def test_interval_one_is_the_uncached_run_bit_for_bit(tiny_loaded, cpu):
    plain = prepare(tiny_loaded, OptimizationConfig(), cpu, use_cache=False)
    reference = _loop(plain, tiny_loaded.spec)
    for level in (1, 2):  # the written-out forward, whatever the branch level it would cache
        wrapper = StepCachedUNet(tiny_loaded.unet, 1, level)
        through = PreparedModel(
            unet=tiny_loaded.unet,
            autoencoder=tiny_loaded.autoencoder,
            config=OptimizationConfig(),
            device=cpu,
            unet_call=wrapper,
        )
        assert torch.equal(_loop(through, tiny_loaded.spec), reference)
        assert (wrapper.full_passes, wrapper.cached_passes) == (4, 0)


def test_a_cached_run_differs_from_uncached_but_stays_close(tiny_loaded, cpu):
    reference = _loop(prepare(tiny_loaded, OptimizationConfig(), cpu, use_cache=False), tiny_loaded.spec)
    prepared = _cached(tiny_loaded, cpu, interval=3, level=1)
    volumes = _loop(prepared, tiny_loaded.spec)
    assert not torch.equal(volumes, reference)
    assert psnr(reference, volumes) > 25.0
    # Four steps, a full pass every third (steps 0 and 3), the other two cached.
    assert (prepared.unet_call.full_passes, prepared.unet_call.cached_passes) == (2, 2)


def test_a_cached_step_on_the_input_of_its_full_pass_gives_the_full_output(tiny_loaded):
    """Only the deep part comes from the cache: with the same input it is the same, so the shallow path is
    MONAI's own computation."""
    g = torch.Generator().manual_seed(0)
    spec = tiny_loaded.spec
    n = len(spec.conditioning)
    x = torch.randn(2, spec.latent_shape[0] + n, *spec.latent_shape[1:], generator=g)
    t, context = torch.full((2,), 400.0), torch.rand(2, 1, n, generator=g)
    with torch.inference_mode():
        full = tiny_loaded.unet(x, timesteps=t, context=context)
        for level in range(1, unet_levels(tiny_loaded.unet) + 1):
            wrapper = StepCachedUNet(tiny_loaded.unet, 2, level)
            for index in (0, 1):
                token = CURRENT_STEP.set(StepIndex(7, index, 2))
                try:
                    out = wrapper(x, t, context)
                finally:
                    CURRENT_STEP.reset(token)
                torch.testing.assert_close(out, full, rtol=0, atol=1e-6)
            assert wrapper.cached_passes == 1


def test_the_cache_never_crosses_runs_or_seeds(tiny_loaded, cpu):
    prepared = _cached(tiny_loaded, cpu)
    first = _loop(prepared, tiny_loaded.spec, seed=1)
    other = _loop(prepared, tiny_loaded.spec, seed=2)
    again = _loop(prepared, tiny_loaded.spec, seed=1)
    assert torch.equal(first, again)  # seed 2's cache did not leak into seed 1's second run
    fresh = _loop(_cached(tiny_loaded, cpu), tiny_loaded.spec, seed=2)
    assert torch.equal(other, fresh)
    assert prepared.unet_call.full_passes == 3 * 2  # each run starts with a full pass
    # A call outside the loop runs the whole U-Net and keeps nothing.
    spec = tiny_loaded.spec
    x = torch.randn(1, spec.latent_shape[0] + len(spec.conditioning), *spec.latent_shape[1:])
    with torch.inference_mode():
        prepared.denoiser(x, torch.full((1,), 10.0), torch.rand(1, 1, len(spec.conditioning)))
    assert prepared.unet_call._cache is None


def test_guidance_caches_its_two_halves_each_from_its_own_pass(tiny_loaded):
    """The doubled batch of classifier-free guidance: a cached step of the pair equals cached steps of each
    half run on its own (nothing of one half's feature reaches the other)."""
    spec = tiny_loaded.spec
    n = len(spec.conditioning)
    g = torch.Generator().manual_seed(3)
    shape = (spec.latent_shape[0] + n, *spec.latent_shape[1:])
    x0, x1 = torch.randn(2, *shape, generator=g), torch.randn(2, *shape, generator=g)
    t0, t1 = torch.full((2,), 600.0), torch.full((2,), 550.0)
    context = torch.cat([torch.full((1, 1, n), -1.0), torch.rand(1, 1, n, generator=g)])

    def two_steps(wrapper, xs, ts, ctx):
        outs = []
        for index, (x, t) in enumerate(zip(xs, ts, strict=True)):
            token = CURRENT_STEP.set(StepIndex(11, index, 2))
            try:
                with torch.inference_mode():
                    outs.append(wrapper(x, t, ctx))
            finally:
                CURRENT_STEP.reset(token)
        return outs[-1]

    pair = StepCachedUNet(tiny_loaded.unet, 2, 1)
    together = two_steps(pair, (x0, x1), (t0, t1), context)
    assert pair.cached_passes == 1 and pair._cache.feature.shape[0] == 2
    halves = [
        two_steps(
            StepCachedUNet(tiny_loaded.unet, 2, 1),
            (x0[i : i + 1], x1[i : i + 1]),
            (t0[:1], t1[:1]),
            context[i : i + 1],
        )
        for i in (0, 1)
    ]
    torch.testing.assert_close(together, torch.cat(halves), rtol=1e-4, atol=1e-5)


def test_provenance_records_the_setting(tiny_models_dir, tmp_path):
    from engine.backends.local import LocalBackend
    from engine.models.registry import ModelRegistry

    backend = LocalBackend("cpu", ModelRegistry([tiny_models_dir]))
    config = OptimizationConfig(step_cache_interval=2, step_cache_level=1)
    result = run(backend.sample(SamplingRequest(model="tiny-latent", steps=4, seed=3, optimization=config)))
    optimization = result.provenance["optimization"]
    assert optimization["requested"]["step_cache_interval"] == 2
    entry = optimization["report"]["step_cache"]
    assert entry["applied"] and entry["requested"] == "every 2 steps, level 1"
    assert json.loads(json.dumps(result.provenance))["optimization"] == optimization
    # The same run without caching reports nothing requested, and its request leaves the fields out.
    plain = run(backend.sample(SamplingRequest(model="tiny-latent", steps=4, seed=3)))
    assert plain.provenance["optimization"]["report"]["step_cache"]["applied"] is False
    assert "step_cache_interval" not in plain.provenance["optimization"]["requested"]


def test_bad_settings_are_refused_in_one_line(tiny_loaded, cpu):
    with pytest.raises(InvalidRequest, match="deeper than this U-Net's 2 levels"):
        _cached(tiny_loaded, cpu, interval=2, level=3)
    for bad in ({"step_cache_interval": 0}, {"step_cache_interval": 2.5}, {"step_cache_level": True}):
        with pytest.raises(InvalidRequest, match="whole number from 1"):
            OptimizationConfig.from_dict(bad)
    with pytest.raises(InvalidRequest, match="either step caching or compilation"):
        OptimizationConfig(step_cache_interval=3, compile_mode="default")
    config = OptimizationConfig(step_cache_interval=4, step_cache_level=2)
    assert OptimizationConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert config.summary() == "cache:k4-l2"


def test_the_server_schema_and_the_cli_carry_the_setting(model_path_env, tmp_path):
    from engine.cli import main
    from engine.server.schemas import OptimizationBody

    body = OptimizationBody.model_validate(OptimizationConfig(step_cache_interval=3).to_dict())
    assert OptimizationConfig.from_dict(body.model_dump()) == OptimizationConfig(step_cache_interval=3)

    out = tmp_path / "cached.nii.gz"
    argv = ["generate", "--model", "tiny-latent", "--steps", "4", "--device", "cpu", "--out", str(out)]
    assert main([*argv, "--step-cache-interval", "2", "--step-cache-level", "2"]) == 0
    sidecar = json.loads(out.with_name("cached.json").read_text())
    assert sidecar["optimization"]["requested"]["step_cache_interval"] == 2
    assert sidecar["optimization"]["report"]["step_cache"]["requested"] == "every 2 steps, level 2"


def test_the_maisi_u_net_is_cached_through_its_own_forward():
    """NV-Generate-MR-Brain's U-Net (tiny channels): the written-out forward gives its output bit for bit,
    and a cached step on the same input gives it again."""
    from engine.models.bundle import _resolve
    from engine.models.maisi import maisi_denoiser
    from engine.models.networks import build_network
    from engine.models.reference import perturb_
    from engine.testing import maisi_definitions

    config = maisi_definitions(tiny=True)
    torch.manual_seed(0)
    unet = build_network(_resolve(config, config["diffusion_unet_def"]), "diffusion_unet_def").eval()
    perturb_(unet, 0.02, torch.Generator().manual_seed(1))  # MONAI zero-initialises the output convolution
    denoiser = maisi_denoiser(unet).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 8, 8, 8, generator=g)
    t = torch.full((2,), 300.0)
    context = torch.tensor([[[0.0, 94.0, 94.0, 136.0]], [[10.0, 94.0, 94.0, 136.0]]])
    with torch.inference_mode():
        full = denoiser(x, t, context)
        assert torch.equal(StepCachedUNet(denoiser, 1, 1)(x, t, context), full)
        levels = unet_levels(denoiser)
        assert levels == len(unet.down_blocks) and levels >= 2
        wrapper = StepCachedUNet(denoiser, 2, 2)
        for index in (0, 1):
            token = CURRENT_STEP.set(StepIndex(5, index, 2))
            try:
                out = wrapper(x, t, context)
            finally:
                CURRENT_STEP.reset(token)
            torch.testing.assert_close(out, full, rtol=0, atol=1e-6)
    assert (wrapper.full_passes, wrapper.cached_passes) == (1, 1)


def test_compare_judges_step_caching_on_the_whole_loop(tiny_models_dir):
    from engine.api import drive
    from engine.backends.local import LocalBackend
    from engine.compare import END_TO_END, compare_settings
    from engine.models.registry import ModelRegistry

    backend = LocalBackend("cpu", ModelRegistry([tiny_models_dir]))
    request = SamplingRequest(model="tiny-latent", steps=4, seed=2)
    cached = OptimizationConfig(step_cache_interval=2)
    comparison = drive(
        compare_settings(backend, request, OptimizationConfig(), cached, kernel_profile_steps=0)
    )
    assert comparison.changed_parts() == frozenset({"unet"})
    headline = comparison.headline()
    assert headline.part == END_TO_END and "step caching" in headline.reason
    assert comparison.b.report["step_cache"]["applied"]


def _steps(wrapper, x, t, context, run_id, indices):
    """Calls ``wrapper`` at each step index of one run, as the loop does; returns the outputs."""
    outs = []
    for index in indices:
        token = CURRENT_STEP.set(StepIndex(run_id, index, max(indices) + 1))
        try:
            outs.append(wrapper(x, t, context))
        finally:
            CURRENT_STEP.reset(token)
    return outs


def test_a_forecast_extrapolates_the_deep_feature_from_the_last_two_full_passes(tiny_loaded):
    """Full passes at steps 0 and 2 (interval 2) on different inputs; the cached step 3 runs the shallow path on
    feature(2) + (3 - 2) / (2 - 0) * (feature(2) - feature(0)), and step 1 (one full pass so far) reuses it."""
    spec = tiny_loaded.spec
    n = len(spec.conditioning)
    g = torch.Generator().manual_seed(4)
    shape = (2, spec.latent_shape[0] + n, *spec.latent_shape[1:])
    x0, x2 = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    t, context = torch.full((2,), 500.0), torch.rand(2, 1, n, generator=g)
    with torch.inference_mode():
        wrapper = StepCachedUNet(tiny_loaded.unet, 2, 1, forecast=True)
        held = StepCachedUNet(tiny_loaded.unet, 2, 1)
        emb, ctx = wrapper._embedding(x2, t, context)
        features = [wrapper._full(x, emb, ctx)[1] for x in (x0, x2)]
        (step1,) = _steps(wrapper, x0, t, context, 9, [0, 1])[1:]
        assert torch.equal(step1, _steps(held, x0, t, context, 9, [0, 1])[1])  # nothing to extrapolate yet
        token = CURRENT_STEP.set(StepIndex(9, 2, 4))
        try:
            wrapper(x2, t, context)
        finally:
            CURRENT_STEP.reset(token)
        (step3,) = _steps(wrapper, x2, t, context, 9, [3])
        expected = wrapper._shallow(x2, emb, ctx, features[1] + 0.5 * (features[1] - features[0]))
        torch.testing.assert_close(step3, expected, rtol=0, atol=1e-6)
        assert not torch.allclose(step3, wrapper._shallow(x2, emb, ctx, features[1]))
    assert (wrapper.full_passes, wrapper.cached_passes) == (2, 2)


def test_a_forecast_never_extrapolates_across_runs(tiny_loaded):
    spec = tiny_loaded.spec
    n = len(spec.conditioning)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, spec.latent_shape[0] + n, *spec.latent_shape[1:], generator=g)
    t, context = torch.full((1,), 300.0), torch.rand(1, 1, n, generator=g)
    with torch.inference_mode():
        wrapper = StepCachedUNet(tiny_loaded.unet, 2, 1, forecast=True)
        _steps(wrapper, x, t, context, 1, [0, 1, 2])
        assert wrapper._cache.previous is not None  # run 1 had two full passes
        _steps(wrapper, x, t, context, 2, [0])
        assert wrapper._cache.previous is None  # run 2's first full pass starts a new history


def test_the_forecast_setting_reaches_the_loop_the_provenance_and_the_cli(
    tiny_models_dir, model_path_env, tmp_path
):
    from engine.backends.local import LocalBackend
    from engine.cli import main
    from engine.models.registry import ModelRegistry

    config = OptimizationConfig(step_cache_interval=2, step_cache_forecast=True)
    assert config.summary() == "cache:k2-l1-f"
    assert OptimizationConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert (
        "step_cache_forecast" not in OptimizationConfig(step_cache_interval=2).to_dict()
    )  # old wire as it was

    backend = LocalBackend("cpu", ModelRegistry([tiny_models_dir]))
    request = SamplingRequest(model="tiny-latent", steps=6, seed=3, optimization=config)
    forecast = run(backend.sample(request))
    held = run(backend.sample(request.replace(optimization=OptimizationConfig(step_cache_interval=2))))
    entry = forecast.provenance["optimization"]["report"]["step_cache"]
    assert entry["applied"] and entry["requested"] == "every 2 steps, level 1, forecast"
    assert "extrapolate" in entry["reason"]
    # Steps 0, 2, 4 full; 3 and 5 forecast from two full passes, so the volumes differ from the held run's.
    assert not np.array_equal(forecast.volume(0), held.volume(0))

    out = tmp_path / "forecast.nii.gz"
    argv = ["generate", "--model", "tiny-latent", "--steps", "4", "--device", "cpu", "--out", str(out)]
    assert main([*argv, "--step-cache-interval", "2", "--step-cache-forecast"]) == 0
    sidecar = json.loads(out.with_name("forecast.json").read_text())
    assert sidecar["optimization"]["requested"]["step_cache_forecast"] is True


@pytest.mark.slow
def test_on_the_shipped_model_a_forecast_stays_closer_to_the_uncached_run():
    """The reason the setting exists, on the real demo model (DDIM 20 steps, a full pass every 3 steps): the
    forecast run is much closer to the uncached run than the run that holds the cached feature."""
    from engine.backends.local import LocalBackend

    backend = LocalBackend("cpu")
    request = SamplingRequest(model="brain-t1-demo", steps=20, seed=5)
    reference = run(backend.sample(request)).volume(0)
    held, forecast = (
        run(
            backend.sample(
                request.replace(
                    optimization=OptimizationConfig(step_cache_interval=3, step_cache_forecast=forecasting)
                )
            )
        ).volume(0)
        for forecasting in (False, True)
    )
    assert psnr(reference, forecast) > psnr(reference, held) + 6.0
