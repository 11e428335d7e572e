"""SamplingRequest validation and JSON, and the local backend's generator contract."""

from __future__ import annotations

import gc
import json
import time

import numpy as np
import pytest

from engine.api import Backend, Progress, SamplingRequest, run
from engine.backends.local import LocalBackend
from engine.errors import InvalidRequest
from engine.optimization.apply import OptimizationConfig
from engine.sampling import PreviewPacer


def test_request_json_round_trip():
    request = SamplingRequest(
        model="m",
        sampler="ddpm",
        steps=7,
        seed=2**40,
        conditioning={"a": 1.5},
        guidance_scale=2.0,
        batch_size=3,
        optimization=OptimizationConfig(autocast="bf16"),
        preview_interval=2,
        xla_plan="dp2xd2/cut@2",
    )
    again = SamplingRequest.from_json(request.to_json())
    assert again == request
    assert json.loads(request.to_json())["optimization"]["autocast"] == "bf16"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"steps": -1}, r"steps must be a whole number from 1 to 10000 \(0: the model's default\), got -1"),
        ({"sampler": "euler"}, "unknown sampler 'euler'; choose one of ddpm, ddim, pndm, rflow"),
        ({"seed": -5}, "seed must be a whole number"),
        ({"batch_size": 0}, "batch size must be a whole number from 1 to 16, got 0"),
        ({"seed": 2**63}, r"seed must be a whole number from 0 to 2\^63-1, got 9223372036854775808"),
        (
            {"seed": 10**5000},
            "seed must be a whole number from 0 to 2\\^63-1, got a whole number of about 5000 digits",
        ),
        ({"guidance_scale": float("nan")}, "guidance scale must be a finite number"),
        ({"guidance_scale": "3"}, "guidance scale must be a finite number"),
        ({"conditioning": {"age": float("inf")}}, "condition 'age' must be a finite number"),
        ({"preview_interval": -1}, "preview interval must be a whole number from 0 to 10000"),
        ({"output_size": (8, 8)}, "output size must be three whole numbers from 1 to 4096"),
        ({"voxel_spacing_mm": (1, 0, 1)}, r"voxel spacing must be three finite numbers > 0 \(mm\)"),
        ({"xla_plan": "dp"}, "xla_plan must be empty, 'best' or a plan name"),
        ({"xla_plan": "best; rm -rf"}, "xla_plan must be empty, 'best' or a plan name"),
    ],
)
def test_request_rejects_bad_values(kwargs, message):
    with pytest.raises(InvalidRequest, match=message):
        SamplingRequest(**kwargs)


def test_request_from_dict_rejects_unknown_fields():
    with pytest.raises(InvalidRequest, match="unknown request field"):
        SamplingRequest.from_dict({"model": "x", "temperature": 3})


def test_backend_satisfies_protocol(backend):
    assert isinstance(backend, Backend)
    assert backend.info().device == "cpu"


def test_same_request_gives_bit_identical_volume(backend):
    request = SamplingRequest(model="tiny-latent", sampler="ddpm", steps=4, seed=123, batch_size=2)
    first = run(backend.sample(request))
    second = run(backend.sample(request))
    assert np.array_equal(first.volumes, second.volumes)
    other = run(backend.sample(request.replace(seed=124)))
    assert not np.allclose(first.volumes, other.volumes)


def test_progress_stages_and_previews(backend):
    events: list[Progress] = []
    result = run(
        backend.sample(SamplingRequest(model="tiny-latent", steps=6, preview_interval=2)), events.append
    )
    stages = [e.stage for e in events]
    assert stages[0] == "load" and stages[-1] == "decode"
    denoise_steps = [e.step for e in events if e.stage == "denoise"]
    assert denoise_steps == list(range(0, 7))
    previews = [e for e in events if e.preview is not None]
    assert [e.step for e in previews] == [2, 4]  # the final volume itself follows, so no preview at step 6
    assert previews[0].preview.shape == result.volumes.shape[2:]
    assert previews[0].preview.dtype == np.float32


def test_batch_members_differ(backend):
    result = run(backend.sample(SamplingRequest(model="tiny-pixel", steps=3, batch_size=3)))
    assert result.volumes.shape == (3, 1, 16, 24, 16)
    assert not np.allclose(result.volumes[0], result.volumes[1])


def test_conditioning_changes_the_volume(backend):
    low = run(
        backend.sample(SamplingRequest(model="tiny-latent", steps=3, conditioning={"ventricle_volume": 5}))
    )
    high = run(
        backend.sample(SamplingRequest(model="tiny-latent", steps=3, conditioning={"ventricle_volume": 80}))
    )
    assert not np.allclose(low.volumes, high.volumes)


def test_provenance_record(backend):
    result = run(
        backend.sample(
            SamplingRequest(model="tiny-latent", steps=2, seed=5, conditioning={"brain_volume": 1000})
        )
    )
    prov = result.provenance
    assert prov["synthetic"] is True
    assert prov["seed"] == 5
    assert prov["model"]["id"] == "tiny-latent"
    assert len(prov["model"]["weights_sha256"]["weights.safetensors"]) == 64
    assert prov["conditioning"] == {"brain_volume": 1000.0, "ventricle_volume": 25.0}
    assert prov["scheduler"]["class"] == "DDIMScheduler" and prov["scheduler"]["steps"] == 2
    assert prov["request"]["sampler"] == "ddim"  # the model default, filled in
    assert {"torch", "monai", "volsynth"} <= set(prov["versions"])
    assert prov["timings"]["total_s"] > 0
    json.dumps(prov)  # must be JSON-ready


def test_cancel_stops_within_one_step(backend):
    job = backend.sample(SamplingRequest(model="tiny-latent", steps=50))
    seen = []
    for progress in job:
        seen.append(progress)
        if progress.stage == "denoise" and progress.step == 3:
            job.close()
            break
    assert seen[-1].step == 3
    with pytest.raises(StopIteration):
        next(job)
    gc.collect()
    # The backend is usable afterwards.
    assert run(backend.sample(SamplingRequest(model="tiny-latent", steps=2))).volumes.shape[0] == 1


def test_run_helper_cancels(backend):
    calls = []
    result = run(
        backend.sample(SamplingRequest(model="tiny-latent", steps=20)),
        calls.append,
        should_cancel=lambda: len(calls) >= 4,
    )
    assert result is None
    assert len(calls) == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sampler": "rflow"}, "cannot sample with 'rflow'; it supports ddim, ddpm, pndm"),
        ({"steps": 5000}, "cannot exceed the model's 1000 training timesteps"),
        ({"conditioning": {"age": 40}}, "has no condition 'age'"),
        ({"conditioning": {"brain_volume": 10}}, "outside the model's range"),
    ],
)
def test_model_specific_validation_fails_before_loading(backend, kwargs, message):
    job = backend.sample(SamplingRequest(model="tiny-latent", **kwargs))
    with pytest.raises(InvalidRequest, match=message):
        next(job)


def test_guidance_refused_for_models_without_it(backend):
    with pytest.raises(InvalidRequest, match="not trained for classifier-free guidance"):
        next(backend.sample(SamplingRequest(model="tiny-pixel", guidance_scale=2.0)))


def test_guidance_runs_for_models_with_it(backend):
    plain = run(backend.sample(SamplingRequest(model="tiny-latent", steps=3)))
    guided = run(backend.sample(SamplingRequest(model="tiny-latent", steps=3, guidance_scale=3.0)))
    assert not np.allclose(plain.volumes, guided.volumes)


def test_unset_guidance_uses_the_models_default(tmp_path):
    from engine.testing import make_tiny_model

    folder = str(make_tiny_model(tmp_path / "guided", model_id="guided", default_guidance_scale=3.0))
    backend = LocalBackend(device="cpu")
    default = run(backend.sample(SamplingRequest(model=folder, steps=3)))
    explicit = run(backend.sample(SamplingRequest(model=folder, steps=3, guidance_scale=3.0)))
    plain = run(backend.sample(SamplingRequest(model=folder, steps=3, guidance_scale=1.0)))
    np.testing.assert_array_equal(default.volumes, explicit.volumes)
    assert not np.allclose(default.volumes, plain.volumes)
    # What ran is recorded, not "unset": the provenance says 3.
    assert default.provenance["request"]["guidance_scale"] == 3.0
    assert plain.provenance["request"]["guidance_scale"] == 1.0


def test_unset_guidance_is_plain_sampling_for_models_without_a_default(backend):
    result = run(backend.sample(SamplingRequest(model="tiny-pixel", steps=2)))
    assert result.provenance["request"]["guidance_scale"] == 1.0


def test_refused_optimization_fails_before_loading(backend, monkeypatch):
    loads = []
    monkeypatch.setattr(backend, "_loaded", loads.append)
    with pytest.raises(InvalidRequest, match="CUDA graphs need an NVIDIA GPU"):
        next(
            backend.sample(
                SamplingRequest(model="tiny-latent", optimization=OptimizationConfig(cuda_graphs=True))
            )
        )
    assert loads == []


def _simulate_pacer(step_s: float, preview_s: float, steps: int = 50, interval: int = 5):
    """Run the pacer on a synthetic clock; returns the preview steps and the share of time spent on them."""
    pacer, clock, made = PreviewPacer(interval), 0.0, []
    for step in range(1, steps + 1):
        clock += step_s
        if pacer.due(step, steps, clock):
            clock += preview_s
            pacer.record(preview_s)
            made.append(step)
    return made, pacer.spent_s / clock


def test_a_torch_backend_refuses_an_xla_plan_before_loading(backend):
    with pytest.raises(InvalidRequest, match="splits a run over an XLA server's devices"):
        run(backend.sample(SamplingRequest(model="tiny-latent", steps=2, xla_plan="best")))


def test_preview_pacer_makes_every_due_preview_when_previews_are_cheap():
    made, _ = _simulate_pacer(step_s=0.01, preview_s=0.05)
    assert made == [5, 10, 15, 20, 25, 30, 35, 40, 45]  # never at the last step: the result follows
    assert _simulate_pacer(0.01, 0.05, interval=0)[0] == []


def test_preview_pacer_thins_slow_previews_to_a_quarter_of_the_run():
    # The demo model on a 2-core CPU: 0.13 s per step, 0.85 s per preview decode.
    made, share = _simulate_pacer(step_s=0.13, preview_s=0.85)
    assert made[0] == 5 and 2 <= len(made) < 9
    assert share <= 0.25 + 0.85 / (50 * 0.13)  # the budget, overshot by at most the preview that crossed it
    # Unpaced, the same run would spend 9 x 0.85 s = 7.65 s of 14.15 s (54 %) on previews.


def test_slow_previews_are_thinned_in_the_real_loop(backend, monkeypatch):
    import engine.sampling as sampling

    real_to_image = sampling._to_image

    def slow_to_image(prepared, spec, x):  # a decode that costs far more than a step, as on a CPU
        time.sleep(0.3)
        return real_to_image(prepared, spec, x)

    monkeypatch.setattr(sampling, "_to_image", slow_to_image)
    events: list[Progress] = []
    run(backend.sample(SamplingRequest(model="tiny-latent", steps=12, preview_interval=1)), events.append)
    previews = [e.step for e in events if e.preview is not None]
    assert previews[0] == 1 and len(previews) < 11  # 11 are due; without pacing all 11 are made
