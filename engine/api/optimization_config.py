"""The optimization settings as data: what a request asks for, validated, JSON round-trippable.

Kept apart from :mod:`engine.optimization.apply` (which applies them and runs the sampling loop for int8
calibration) so the request types in :mod:`engine.api` do not depend on the code that uses them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from engine.errors import InvalidRequest

AUTOCAST_DTYPES = (None, "bf16", "fp16")
QUANTIZATION_MODES = (None, "int8", "fp8", "mixed")
# The decoder's own precision: None follows ``autocast`` (what every decode did before these settings).
DECODER_AUTOCAST_DTYPES = (None, "fp32", "bf16", "fp16")
DECODER_QUANTIZATION_MODES = (None, "int8", "mixed")
# Decoder settings: left out of ``to_dict`` while at their defaults, so a request that does not use them
# reads exactly as before (older servers and clients, saved settings, the app's controls).
DECODER_DEFAULTS: dict[str, Any] = {
    "decoder_autocast": None,
    "decoder_quantization": None,
    "decoder_channels_last": False,
    "decoder_psnr_budget_db": 40.0,
}
# Likewise left out while off: the override that lets a setting run although it is expected slower here.
OVERRIDE_DEFAULTS: dict[str, Any] = {"allow_slower": False}
# Settings added after the wire format settled: left out of ``to_dict`` while off, so requests that do not
# use them read exactly as before (older servers, saved settings, stored tune results).
LATER_DEFAULTS: dict[str, Any] = {"unet_subpixel": False, "step_cache_interval": 1, "step_cache_level": 1}
STEP_CACHE_MAX_INTERVAL = 50
COMPILE_MODES = (None, "default", "reduce-overhead", "max-autotune")
ATTENTION_KERNELS = ("default", "sdpa")


@dataclass(frozen=True)
class OptimizationConfig:
    """What to change relative to plain fp32 NCDHW eager execution.

    Attributes:
        tf32: TF32 tensor cores for fp32 convolutions and matmuls (NVIDIA, compute capability 8.0+).
        channels_last_3d: weights and inputs in channels-last 3D (NDHWC) memory format.
        autocast: "bf16" or "fp16" mixed precision, or None for fp32.
        attention: "sdpa" routes MONAI's attention blocks through ``F.scaled_dot_product_attention``.
        compile_mode: ``torch.compile`` mode for the U-Net, or None for eager.
        cuda_graphs: capture the U-Net call as a CUDA graph (CUDA only).
        quantization: post-training quantization of the U-Net: "int8" (x86 CPU), "fp8" (Hopper-class GPU
            Linear layers), "mixed" (int8 except the layers needed to meet ``psnr_budget_db``), or None.
        psnr_budget_db: minimum PSNR of the final volume vs fp32 that "mixed" must meet.
        streamed_decode: decode latents layer by layer in slabs: same result, bounded peak memory.
        decoder_autocast: the autoencoder decoder's precision: "bf16"/"fp16" autocast, "fp32", or None to
            follow ``autocast``.
        decoder_quantization: post-training quantization of the decoder: "int8" (every convolution; x86
            CPU) or "mixed" (int8 except the layers needed to keep the decoded volume within
            ``decoder_psnr_budget_db`` of fp32, chosen by their effect on the decoded volume), or None.
        decoder_channels_last: decoder weights and activations in NDHWC (faster oneDNN convolutions on
            x86 CPUs; the streamed decode keeps its stored activations NDHWC too).
        decoder_psnr_budget_db: minimum PSNR of the decoded volume vs the fp32 decode for "mixed".
        allow_slower: run settings that are expected to be slower than fp32 on this machine (reduced
            precision without native kernels, or measured slower here by ``volsynth tune``). Without it
            such a request is refused with the reason; with it the run goes ahead, warns, and its report
            records the override.

        unet_subpixel: compute the U-Net's upsampling convolutions (nearest x2 then 3x3x3) as sub-pixel
            convolutions at the low resolution: the same function up to float rounding, in about a third of
            their multiply-adds (engine/optimization/unet_subpixel.py). It combines with int8 and mixed
            quantization (the sub-pixel convolutions are quantized like the ones they replace).

        step_cache_interval: step caching (engine/optimization/step_cache.py, DeepCache-style): a full U-Net
            pass every ``step_cache_interval``-th step, the steps between recompute only the top
            ``step_cache_level`` levels and reuse the deep feature cached at the last full pass. 1: off.
        step_cache_level: the branch level of step caching, counted from the top (1: only the
            full-resolution level is recomputed at a cached step, the most saved and the largest error).
            Bounded by the U-Net's number of levels when the model is prepared.

    Any decoder setting also computes the decoder's nearest-x2 upsampling convolutions as sub-pixel
    convolutions (the same function in 8/27 of the multiply-adds; the streamed decode always does).
    """

    tf32: bool = False
    channels_last_3d: bool = False
    autocast: str | None = None
    attention: str = "default"
    compile_mode: str | None = None
    cuda_graphs: bool = False
    quantization: str | None = None
    psnr_budget_db: float = 40.0
    streamed_decode: bool = False
    decoder_autocast: str | None = None
    decoder_quantization: str | None = None
    decoder_channels_last: bool = False
    decoder_psnr_budget_db: float = 40.0
    unet_subpixel: bool = False
    step_cache_interval: int = 1
    step_cache_level: int = 1
    allow_slower: bool = False

    def __post_init__(self) -> None:
        if self.autocast not in AUTOCAST_DTYPES:
            raise InvalidRequest(f"autocast must be one of bf16, fp16 or none, got {self.autocast!r}")
        if self.quantization not in QUANTIZATION_MODES:
            raise InvalidRequest(
                f"quantization must be one of int8, fp8, mixed or none, got {self.quantization!r}"
            )
        if self.compile_mode not in COMPILE_MODES:
            raise InvalidRequest(
                f"compile mode must be one of {COMPILE_MODES[1:]} or none, got {self.compile_mode!r}"
            )
        if self.attention not in ATTENTION_KERNELS:
            raise InvalidRequest(f"attention must be one of {ATTENTION_KERNELS}, got {self.attention!r}")
        for budget, what in (
            (self.psnr_budget_db, "PSNR budget"),
            (self.decoder_psnr_budget_db, "decoder PSNR budget"),
        ):
            if (
                isinstance(budget, bool)
                or not isinstance(budget, int | float)
                or not math.isfinite(budget)
                or not 10.0 <= budget <= 150.0
            ):
                raise InvalidRequest(f"{what} must be a number of dB between 10 and 150, got {budget!r}")
        if self.decoder_autocast not in DECODER_AUTOCAST_DTYPES:
            raise InvalidRequest(
                f"decoder autocast must be one of fp32, bf16, fp16 or none (follow autocast), got "
                f"{self.decoder_autocast!r}"
            )
        if self.decoder_quantization not in DECODER_QUANTIZATION_MODES:
            raise InvalidRequest(
                f"decoder quantization must be one of int8, mixed or none, got {self.decoder_quantization!r}"
            )
        if not isinstance(self.unet_subpixel, bool):
            raise InvalidRequest(f"unet_subpixel must be true or false, got {self.unet_subpixel!r}")
        for value, what, top in (
            (self.step_cache_interval, "step cache interval", STEP_CACHE_MAX_INTERVAL),
            (self.step_cache_level, "step cache level", 16),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise InvalidRequest(f"{what} must be a whole number from 1 to {top}, got {value!r}")
        if self.step_caching and (self.compile_mode or self.cuda_graphs):
            raise InvalidRequest(
                "step caching runs the U-Net's levels separately, while torch.compile and CUDA graphs capture "
                "the whole call; choose either step caching or compilation / CUDA graphs"
            )
        if not isinstance(self.allow_slower, bool):
            raise InvalidRequest(f"allow_slower must be true or false, got {self.allow_slower!r}")
        if not isinstance(self.decoder_channels_last, bool):
            raise InvalidRequest(
                f"decoder channels-last must be true or false, got {self.decoder_channels_last!r}"
            )
        decoder_dtype = self.decoder_autocast or self.autocast
        if self.decoder_quantization and decoder_dtype == "fp16":
            raise InvalidRequest(
                "int8 decoder quantization runs on x86 CPUs, which have no fast fp16 kernels; use bf16 "
                "(or fp32) for the decoder with int8"
            )
        # Combinations that are wrong on every device; device-dependent ones are in check_combination.
        if self.quantization in ("int8", "mixed") and self.autocast == "fp16":
            raise InvalidRequest(
                "int8 quantization runs on x86 CPUs, which have no fast fp16 kernels, and fp16 activations add a "
                "second rounding to every requantization; use bf16 autocast (or none) with int8"
            )
        if self.quantization in ("int8", "mixed") and self.compile_mode:
            raise InvalidRequest(
                "torch.compile cannot trace the eager int8 quantized kernels; choose either "
                "quantization or compilation"
            )
        if self.cuda_graphs and self.compile_mode in ("reduce-overhead", "max-autotune"):
            raise InvalidRequest(
                f"compile mode {self.compile_mode!r} already captures CUDA graphs; turn off "
                "CUDA graphs or use compile mode 'default'"
            )

    @property
    def is_default(self) -> bool:
        return self == OptimizationConfig()

    @property
    def settings(self) -> OptimizationConfig:
        """The same settings without the override: what a run changes, for comparing and measuring."""
        return replace(self, allow_slower=False)

    @property
    def step_caching(self) -> bool:
        """Whether step caching is on (an interval above 1)."""
        return self.step_cache_interval > 1

    @property
    def optimizes_decoder(self) -> bool:
        """Whether any decoder setting asks for a change (the decoder is then prepared on a copy)."""
        return bool(self.decoder_autocast or self.decoder_quantization or self.decoder_channels_last)

    def to_dict(self) -> dict[str, Any]:
        """Every setting, except decoder settings and the override left at their defaults."""
        data = asdict(self)
        if not self.allow_slower:
            del data["allow_slower"]
        for name, value in LATER_DEFAULTS.items():
            if data[name] == value:
                del data[name]
        for name, value in DECODER_DEFAULTS.items():
            if data[name] == value and not (
                name == "decoder_psnr_budget_db" and self.decoder_quantization == "mixed"
            ):
                del data[name]
        return data

    def summary(self) -> str:
        """The settings that differ from plain fp32, in a few words: "bf16+sdpa", "int8+cl", "fp32"."""
        parts = [name for name, on in (("tf32", self.tf32), ("cl", self.channels_last_3d)) if on]
        parts += [v for v in (self.autocast, self.quantization) if v]
        if self.quantization == "mixed" and self.psnr_budget_db != 40.0:
            parts[-1] += f"@{self.psnr_budget_db:g}dB"
        if self.attention != "default":
            parts.append(self.attention)
        if self.compile_mode:
            parts.append("compile" if self.compile_mode == "default" else f"compile:{self.compile_mode}")
        parts += [
            name
            for name, on in (
                ("subpixel", self.unet_subpixel),
                (f"cache:k{self.step_cache_interval}-l{self.step_cache_level}", self.step_caching),
                ("graphs", self.cuda_graphs),
                ("streamed", self.streamed_decode),
            )
            if on
        ]
        decoder = [v for v in (self.decoder_autocast, self.decoder_quantization) if v]
        if self.decoder_quantization == "mixed" and self.decoder_psnr_budget_db != 40.0:
            decoder[-1] += f"@{self.decoder_psnr_budget_db:g}dB"
        if self.decoder_channels_last:
            decoder.append("cl")
        if decoder:
            parts.append("dec:" + "-".join(decoder))
        return "+".join(parts) or "fp32"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OptimizationConfig:
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise InvalidRequest(f"unknown optimization setting(s): {', '.join(sorted(unknown))}")
        return cls(**dict(data))


# How a front end shows the decoder settings (label, control values with their labels, tooltip), so a
# settings panel can build its controls from here; the report entries have the same names.
DECODER_SETTING_INFO: dict[str, dict[str, Any]] = {
    "decoder_autocast": {
        "label": "Decoder precision",
        "choices": [("Same as autocast", None), ("fp32", "fp32"), ("bf16", "bf16"), ("fp16", "fp16")],
        "tip": "Precision of the autoencoder's decoder; 'Same as autocast' follows the U-Net's autocast",
    },
    "decoder_quantization": {
        "label": "Decoder quantization",
        "choices": [("Off", None), ("int8", "int8"), ("mixed (int8 + float)", "mixed")],
        "tip": "int8 decoder convolutions (x86 CPU), or mixed: int8 except the layers needed to keep the "
        "decoded volume within the decoder PSNR budget of fp32",
    },
    "decoder_channels_last": {
        "label": "Decoder channels-last 3D",
        "choices": [("Off", False), ("On", True)],
        "tip": "Decoder weights and activations in NDHWC (faster oneDNN convolutions on x86 CPUs)",
    },
    "decoder_psnr_budget_db": {
        "label": "Decoder PSNR budget",
        "range_db": (10.0, 150.0),
        "tip": "Mixed decoder quantization keeps enough layers in float for the decoded volume to stay above "
        "this PSNR against fp32",
    },
}


# How a front end shows the step-caching settings, as the decoder settings above.
STEP_CACHE_SETTING_INFO: dict[str, dict[str, Any]] = {
    "step_cache_interval": {
        "label": "Step caching",
        "choices": [("Off (every step full)", 1), *((f"Full pass every {k} steps", k) for k in (2, 3, 4, 5))],
        "cli": "--step-cache-interval",
        "tip": "Reuse the U-Net's deep features between full passes and recompute only the top levels "
        "(DeepCache): faster, not exact; its quality cost is measured by volsynth tune and "
        "python -m engine.bench.step_cache",
    },
    "step_cache_level": {
        "label": "Step cache level",
        "choices": [("Level 1 (most saved)", 1), ("Level 2", 2), ("Level 3", 3)],
        "cli": "--step-cache-level",
        "tip": "How many top levels a cached step recomputes: 1 saves the most and changes the volume most",
    },
}


# The named presets the app offers (app.core.optimization_presets adds their labels); ``volsynth tune``
# measures each one that can apply here, so the app can say what it measured on this machine.
NAMED_PRESETS: dict[str, dict[str, Any]] = {
    "Exact fp32": {},
    "Fast (GPU)": {"tf32": True, "channels_last_3d": True, "autocast": "bf16", "attention": "sdpa"},
    "Low memory": {"streamed_decode": True},
    "Fast decode (CPU)": {"streamed_decode": True, "decoder_autocast": "bf16", "decoder_channels_last": True},
}

# Settings by name: the rows of ``volsynth bench`` and the choices of ``volsynth compare`` and the app's
# Compare Settings window. Values are ``OptimizationConfig`` fields.
NAMED_SETTINGS: dict[str, dict[str, Any]] = {
    "fp32": {},
    "tf32": {"tf32": True},
    "channels_last": {"channels_last_3d": True},
    "bf16": {"autocast": "bf16"},
    "fp16": {"autocast": "fp16"},
    "sdpa": {"attention": "sdpa"},
    "compile": {"compile_mode": "default"},
    "cuda_graphs": {"cuda_graphs": True},
    "int8": {"quantization": "int8"},
    "mixed": {"quantization": "mixed", "psnr_budget_db": 40.0},
    "subpixel": {"unet_subpixel": True},
    # Step caching (engine/optimization/step_cache.py): a full pass every k-th step, level l recomputed.
    **{
        f"cache:k{k}-l{level}": {"step_cache_interval": k, "step_cache_level": level}
        for k, level in ((2, 1), (3, 1), (4, 1), (5, 1), (3, 2))
    },
    "int8+subpixel": {"quantization": "int8", "unet_subpixel": True},
    "mixed+subpixel": {"quantization": "mixed", "psnr_budget_db": 40.0, "unet_subpixel": True},
    "mixed+sdpa": {"quantization": "mixed", "attention": "sdpa", "psnr_budget_db": 40.0},
    "mixed+sdpa+subpixel": {
        "quantization": "mixed",
        "attention": "sdpa",
        "psnr_budget_db": 40.0,
        "unet_subpixel": True,
    },
    "fp8": {"quantization": "fp8", "autocast": "bf16"},
    "streamed_decode": {"streamed_decode": True},
    "bf16+sdpa": {"autocast": "bf16", "attention": "sdpa"},
    "bf16+sdpa+cl": {"autocast": "bf16", "attention": "sdpa", "channels_last_3d": True},
    "int8+sdpa": {"quantization": "int8", "attention": "sdpa"},
    "int8+bf16+sdpa": {"quantization": "int8", "autocast": "bf16", "attention": "sdpa"},
    "mixed+bf16+sdpa": {
        "quantization": "mixed",
        "autocast": "bf16",
        "attention": "sdpa",
        "psnr_budget_db": 40.0,
    },
    "tf32+cl": {"tf32": True, "channels_last_3d": True},
    "tf32+cl+sdpa": {"tf32": True, "channels_last_3d": True, "attention": "sdpa"},
    "bf16+cl+sdpa+compile": {
        "autocast": "bf16",
        "channels_last_3d": True,
        "attention": "sdpa",
        "compile_mode": "default",
    },
    "bf16+sdpa+graphs": {"autocast": "bf16", "attention": "sdpa", "cuda_graphs": True},
    # The decoder's own settings (rows of ``volsynth bench --decoder-only``); "streamed" rows bound memory.
    "dec:bf16": {"decoder_autocast": "bf16"},
    "dec:bf16-cl": {"decoder_autocast": "bf16", "decoder_channels_last": True},
    "dec:int8-cl": {"decoder_quantization": "int8", "decoder_channels_last": True},
    "dec:mixed-bf16-cl": {
        "decoder_quantization": "mixed",
        "decoder_autocast": "bf16",
        "decoder_channels_last": True,
    },
    "streamed+dec:bf16": {"streamed_decode": True, "decoder_autocast": "bf16"},
    "streamed+dec:bf16-cl": {
        "streamed_decode": True,
        "decoder_autocast": "bf16",
        "decoder_channels_last": True,
    },
    "streamed+dec:int8": {"streamed_decode": True, "decoder_quantization": "int8"},
    "streamed+dec:int8-cl": {
        "streamed_decode": True,
        "decoder_quantization": "int8",
        "decoder_channels_last": True,
    },
    "streamed+dec:int8-bf16-cl": {
        "streamed_decode": True,
        "decoder_quantization": "int8",
        "decoder_autocast": "bf16",
        "decoder_channels_last": True,
    },
    "streamed+dec:mixed-cl": {
        "streamed_decode": True,
        "decoder_quantization": "mixed",
        "decoder_channels_last": True,
    },
    "streamed+dec:mixed-bf16-cl": {
        "streamed_decode": True,
        "decoder_quantization": "mixed",
        "decoder_autocast": "bf16",
        "decoder_channels_last": True,
    },
}
