"""Datasheet peak arithmetic rates of NVIDIA cards, and achieved TFLOP/s as a fraction of them.

Dense rates (no 2:4 sparsity) in TFLOP/s, from NVIDIA's product datasheets: the datasheets print Tensor-Core
rates "with sparsity", which are twice the dense ones, so those figures are halved here.

* H200 SXM / NVL: NVIDIA H200 Tensor Core GPU datasheet (2024): FP32 67 / 60, TF32 989 / 835, BF16 and FP16
  1,979 / 1,671 (with sparsity).
* H100 SXM / PCIe / NVL: NVIDIA H100 Tensor Core GPU datasheet (2023): FP32 67 / 51 / 60, TF32 989 / 756 / 835,
  BF16 and FP16 1,979 / 1,513 / 1,671 (with sparsity).
* A100 (SXM and PCIe, 40 and 80 GB): NVIDIA A100 Tensor Core GPU datasheet (2021): FP32 19.5, TF32 156, BF16
  and FP16 312 (dense).
* L40S: NVIDIA L40S datasheet (2023): FP32 91.6, TF32 183, BF16 and FP16 362.05 (dense).
* L4: NVIDIA L4 datasheet (2023): FP32 30.3, TF32 120, BF16 and FP16 242 (with sparsity).

Marketing peaks assume boost clocks; a card held at a lower clock by its power limit reaches less, so a
fraction of peak is an upper-bound comparison, not an efficiency to two digits. Cards not listed get
``None`` and the check says so instead of guessing.
"""

from __future__ import annotations

import re

# (pattern on torch.cuda.get_device_name / NVML's name, card, {precision: dense TFLOP/s}); most specific first.
PEAK_TABLE: tuple[tuple[str, str, dict[str, float]], ...] = (
    (r"H200\s*NVL", "H200 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
    (r"H200", "H200 SXM", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5}),
    (r"H100\s*NVL", "H100 NVL", {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5}),
    (r"H100\s*PCIe", "H100 PCIe", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5}),
    (r"H100", "H100 SXM", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5}),
    (r"A100", "A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}),
    (r"L40S", "L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05}),
    (r"\bL4\b", "L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}),
)
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")


def card_for(device_name: str) -> str | None:
    """The table's card for a device name such as ``"NVIDIA H100 80GB HBM3"``, or ``None``."""
    for pattern, card, _ in PEAK_TABLE:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return card
    return None


def peak_tflops(device_name: str, precision: str) -> float | None:
    """Dense datasheet peak for ``precision`` (fp32, tf32, bf16, fp16) on this card; ``None`` if unknown."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    for pattern, _, peaks in PEAK_TABLE:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return peaks[precision]
    return None


def achieved_tflops(flops: float, ms: float) -> float:
    """TFLOP/s of ``flops`` floating-point operations done in ``ms`` milliseconds."""
    if ms <= 0:
        raise ValueError(f"a time must be positive, not {ms} ms")
    return flops / (ms / 1e3) / 1e12


def fraction_of_peak(tflops: float, device_name: str, precision: str) -> float | None:
    """``tflops`` over the card's peak for ``precision``; ``None`` for a card the table lacks."""
    peak = peak_tflops(device_name, precision)
    return None if peak is None else tflops / peak


def effective_precision(requested: str, applied: dict[str, bool]) -> str:
    """The precision class a row really ran in: the requested one only if its precision setting applied.

    A TF32 row on a card without TF32 runs in fp32 and is measured against the fp32 peak, not against a
    Tensor-Core peak it never used; a bf16 row counts as bf16 when autocast applied, whatever else did not.
    """
    setting = {"tf32": "tf32", "bf16": "autocast", "fp16": "autocast"}.get(requested)
    if setting is None:
        return "fp32"
    return requested if applied.get(setting) is True else "fp32"
