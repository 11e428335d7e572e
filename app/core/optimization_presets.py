"""Named optimization presets of the Generate panel and the Compare window (Qt-free, torch-free)."""

from __future__ import annotations

from typing import Any

from engine.optimization_config import OptimizationConfig

BLOCK_SOURCE = "optimization"  # the form's block key for refused optimization settings
DEFAULTS: dict[str, Any] = OptimizationConfig().to_dict()
PRESETS: dict[str, dict[str, Any]] = {
    "Exact fp32": {},
    "Fast (GPU)": {"tf32": True, "channels_last_3d": True, "autocast": "bf16", "attention": "sdpa"},
    "Low memory": {"streamed_decode": True},
}
PRESET_TIPS = {
    "Exact fp32": "Plain fp32 NCDHW eager execution: the reference every other setting is measured against",
    "Fast (GPU)": "TF32, channels-last 3D, bf16 autocast and SDPA attention: the usual speed-ups on NVIDIA GPUs",
    "Low memory": "Decode the volume layer by layer in slabs: the same result with a bounded peak memory",
}
CUSTOM = "Custom"


def preset_values(name: str) -> dict[str, Any]:
    return {**DEFAULTS, **PRESETS[name]}


def preset_of(values: dict[str, Any]) -> str:
    """The preset ``values`` equal, or "Custom". The PSNR budget only matters with mixed quantization."""
    relevant = {
        k: v for k, v in values.items() if k != "psnr_budget_db" or values.get("quantization") == "mixed"
    }
    for name in PRESETS:
        preset = preset_values(name)
        if all(preset[k] == v for k, v in relevant.items()):
            return name
    return CUSTOM
