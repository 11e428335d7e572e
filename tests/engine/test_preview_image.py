"""A run's previews: the clean-sample estimate decoded in the device's native reduced precision (cheaper than
the fp32 decode on a CPU with bf16 kernels), close to the fp32 decode, and never touching the final volume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import engine.sampling as sampling
from engine.api import Progress, SamplingRequest, run
from engine.backends.local import LocalBackend
from engine.machine.probe import probe_machine
from engine.optimization.apply import OptimizationConfig, prepare
from engine.sampling import _to_image, preview_image, preview_precision

CPU = torch.device("cpu")


@pytest.fixture
def bf16_previews(monkeypatch):
    """Previews in bf16 whatever this CPU has (emulated bf16 is slower, not different), so the reduced
    precision path runs on every machine the tests run on."""
    monkeypatch.setattr(sampling, "preview_precision", lambda device: torch.bfloat16)


def _prepared(registry, model_id: str):
    source = registry.get(model_id)
    return prepare(source.load(), OptimizationConfig(), CPU, use_cache=False), source.spec


def _psnr(a: torch.Tensor, reference: torch.Tensor) -> float:
    span = float(reference.max() - reference.min())
    return 10 * float(np.log10(span**2 / float(((a - reference) ** 2).mean())))


def test_previews_use_reduced_precision_only_where_the_device_has_native_kernels():
    expected = torch.bfloat16 if probe_machine().cpu.native_bf16 else None
    assert preview_precision(CPU) is expected
    assert preview_precision(torch.device("meta")) is None  # a device without a known native type: fp32


def test_a_latent_preview_in_bf16_is_close_to_the_full_decode(registry, bf16_previews):
    prepared, spec = _prepared(registry, "tiny-latent")
    x0 = torch.randn((1, *spec.latent_shape_for(None)), generator=torch.Generator().manual_seed(3))
    full = _to_image(prepared, spec, x0)
    preview = sampling.preview_image(prepared, spec, x0, CPU)
    assert preview.shape == full.shape and preview.dtype == torch.float32
    assert bool(torch.isfinite(preview).all())
    assert not torch.equal(preview, full)  # the reduced precision did apply
    assert _psnr(preview, full) > 35.0
    assert np.corrcoef(preview.flatten().numpy(), full.flatten().numpy())[0, 1] > 0.999


def test_without_a_native_reduced_precision_a_preview_is_the_full_decode(registry, monkeypatch):
    monkeypatch.setattr(sampling, "preview_precision", lambda device: None)
    prepared, spec = _prepared(registry, "tiny-latent")
    x0 = torch.randn((1, *spec.latent_shape_for(None)), generator=torch.Generator().manual_seed(4))
    assert torch.equal(preview_image(prepared, spec, x0, CPU), _to_image(prepared, spec, x0))


def test_a_pixel_model_preview_is_its_estimate(registry, bf16_previews):
    prepared, spec = _prepared(registry, "tiny-pixel")
    x0 = torch.randn((1, *spec.latent_shape_for(None)), generator=torch.Generator().manual_seed(5))
    assert torch.equal(sampling.preview_image(prepared, spec, x0, CPU), _to_image(prepared, spec, x0))


@pytest.mark.parametrize("model", ["tiny-latent", "tiny-pixel"])
def test_previews_leave_the_final_volume_bit_identical(registry, bf16_previews, model):
    backend = LocalBackend("cpu", registry)
    request = SamplingRequest(model=model, steps=6, seed=11, preview_interval=0)
    plain = run(backend.sample(request))
    events: list[Progress] = []
    previewed = run(backend.sample(request.replace(preview_interval=1)), events.append)
    previews = [e.preview for e in events if e.preview is not None]
    assert len(previews) == 5  # steps 1-5; the final volume itself follows step 6
    assert all(p.shape == plain.volumes.shape[2:] and np.isfinite(p).all() for p in previews)
    assert np.array_equal(previewed.volumes, plain.volumes)
