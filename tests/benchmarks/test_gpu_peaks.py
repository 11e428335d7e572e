"""Peak lookup by GPU name and the TFLOP/s arithmetic of the GPU check."""

from __future__ import annotations

import pytest

from benchmarks.gpu_peaks import (
    achieved_tflops,
    card_for,
    effective_precision,
    fraction_of_peak,
    peak_tflops,
)


@pytest.mark.parametrize(
    ("device_name", "card"),
    [
        ("NVIDIA H200", "H200 SXM"),  # what torch and nvidia-smi call the SXM part
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),  # not L40S
        ("NVIDIA GeForce RTX 4090", None),
        ("cpu", None),
    ],
)
def test_card_is_found_by_its_device_name(device_name, card):
    assert card_for(device_name) == card


def test_peaks_are_dense_rates_per_precision():
    assert peak_tflops("NVIDIA H200", "fp32") == 67.0
    assert peak_tflops("NVIDIA H200", "tf32") == pytest.approx(989 / 2)  # datasheet 989 is with sparsity
    assert peak_tflops("NVIDIA H200", "bf16") == pytest.approx(1979 / 2)
    assert peak_tflops("NVIDIA A100-SXM4-40GB", "tf32") == 156.0
    assert peak_tflops("NVIDIA GeForce RTX 4090", "bf16") is None
    with pytest.raises(ValueError, match="precision must be one of"):
        peak_tflops("NVIDIA H200", "int4")


def test_achieved_tflops_and_fraction_of_peak():
    assert achieved_tflops(2e12, 1000.0) == pytest.approx(2.0)  # 2 TFLOP in one second
    assert achieved_tflops(6.1e12, 25.0) == pytest.approx(244.0)
    assert fraction_of_peak(achieved_tflops(6.1e12, 25.0), "NVIDIA H100 80GB HBM3", "tf32") == pytest.approx(
        244.0 / 494.5
    )
    assert fraction_of_peak(10.0, "Some other card", "fp32") is None
    with pytest.raises(ValueError, match="positive"):
        achieved_tflops(1e12, 0.0)


def test_a_row_whose_precision_setting_did_not_apply_is_held_to_the_fp32_peak():
    assert effective_precision("tf32", {"tf32": False, "channels_last_3d": True}) == "fp32"
    assert effective_precision("tf32", {"tf32": True, "channels_last_3d": False}) == "tf32"
    assert (
        effective_precision("bf16", {"autocast": True, "channels_last_3d": True, "attention": False})
        == "bf16"
    )
    assert effective_precision("bf16", {"autocast": False}) == "fp32"
    assert effective_precision("fp32", {}) == "fp32"
