"""Named optimization presets of the Generate panel and the Compare window (Qt-free, torch-free)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from engine.api.optimization_config import NAMED_PRESETS, SETTING_ROWS, OptimizationConfig

BLOCK_SOURCE = "optimization"  # the form's block key for refused optimization settings
DEFAULTS: dict[str, Any] = asdict(OptimizationConfig())  # every field, decoder settings included
PRESETS: dict[str, dict[str, Any]] = dict(NAMED_PRESETS)
PRESET_TIPS = {
    "Exact fp32": "Plain fp32 NCDHW eager execution: the reference every other setting is measured against",
    "Fast (GPU)": "TF32, channels-last 3D, bf16 autocast and SDPA attention: the usual speed-ups on NVIDIA GPUs "
    "of compute capability 8.0+ (not yet measured on a GPU by this project)",
    "Low memory": "Decode the volume layer by layer in slabs: the same result with a bounded peak memory",
    "Fast decode (CPU)": "Streamed decode with a bf16, channels-last decoder, at bounded memory: 2.5x the fp32 "
    "decode at 58 dB on an Intel Xeon with AVX-512 BF16 (2 cores; volsynth bench --decoder-only), but far "
    "slower than fp32 on CPUs without native bf16 (AVX2), where it is refused. What it does on this machine: "
    "Generate > Measure Settings on This Machine",
}
CUSTOM = "Custom"


def preset_values(name: str) -> dict[str, Any]:
    return {**DEFAULTS, **PRESETS[name]}


# A PSNR budget only matters when its quantization is "mixed".
BUDGET_OF = {row.name: row.budget_of for row in SETTING_ROWS if row.budget_of}


def preset_of(values: dict[str, Any]) -> str:
    """The preset ``values`` equal, or "Custom" (budgets of quantizations that are not mixed do not count)."""
    relevant = {k: v for k, v in values.items() if k not in BUDGET_OF or values.get(BUDGET_OF[k]) == "mixed"}
    for name in PRESETS:
        preset = preset_values(name)
        if all(preset[k] == v for k, v in relevant.items()):
            return name
    return CUSTOM
