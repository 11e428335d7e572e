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

STEP_CACHE_MAX_INTERVAL = 50


# -- one row per setting ---------------------------------------------------------------------------------
# Where a setting acts (``SettingRow.part``): what a front end groups it under and what it rewrites.
UNET, DECODER, DECODE, OVERRIDE = "unet", "decoder", "decode", "override"


@dataclass(frozen=True)
class SettingRow:
    """Everything said about one ``OptimizationConfig`` field, once: the CLI flags, the server's schema, the
    app's controls and tooltips, the wire format and validation are made from these rows, so a new setting is
    a field, a row and the code that applies it (``engine.optimization.apply``'s entry for its report).

    Attributes:
        name: the ``OptimizationConfig`` field.
        label: its name for people (the app's control, the run details).
        tip: the one explanation: the app's tooltip and the CLI flag's help.
        default: the field's default (plain fp32 NCDHW eager execution).
        part: ``UNET``, ``DECODER`` (the autoencoder's decoder only), ``DECODE`` (how the decode runs) or
            ``OVERRIDE`` (not an optimization: permission to run one).
        choices: the app's control values, ``(label, value)``; empty for a check box or a number box.
        values: every value the setting takes (text settings; None: off); default: the choices' values.
        bounds: the smallest and largest value of a number setting; ``whole`` for whole numbers.
        unit: a number's unit in messages ("dB").
        what: how messages name it; default: the field's name.
        flag: the CLI flag; default: ``--`` and the name with dashes.
        flag_value: the value a flag without an argument sets (a check box's True; ``--sdpa``'s "sdpa").
        metavar: the CLI's name for a number's argument.
        flag_note: what the CLI help says besides the tip (what the command line's values mean).
        report_entry: the report entry saying whether it applied (None: it has none, e.g. a PSNR budget);
            default: the name.
        omitted_at_default: left out of ``to_dict`` while at its default, so requests that do not use it read
            exactly as before the setting existed (older servers and clients, saved settings, tune results).
        kept_while: ``(setting, value)``: sent although at its default while that setting has that value.
        budget_of: a PSNR budget: the quantization setting it bounds (it means something only at "mixed").
        per_model: its speed and quality are the model's own (calibrated and measured per model): a front end
            drops it, with its budget, when the model changes.
        only_with: the setting it refines, which must be on (not at its default) for this one to mean
            anything: the app enables its control only then.
    """

    name: str
    label: str
    tip: str
    default: Any
    part: str = UNET
    choices: tuple[tuple[str, Any], ...] = ()
    values: tuple[Any, ...] = ()
    bounds: tuple[float, float] | None = None
    whole: bool = False
    unit: str = ""
    what: str = ""
    flag: str = ""
    flag_value: Any = True
    metavar: str | None = None
    flag_note: str = ""
    report_entry: str | None = ""
    omitted_at_default: bool = False
    kept_while: tuple[str, Any] | None = None
    budget_of: str = ""
    per_model: bool = False
    only_with: str = ""

    def __post_init__(self) -> None:
        if not self.values and self.choices and not self.bounds:
            object.__setattr__(self, "values", tuple(value for _, value in self.choices))
        object.__setattr__(self, "what", self.what or self.name)
        object.__setattr__(self, "flag", self.flag or "--" + self.name.replace("_", "-"))
        if self.report_entry == "":
            object.__setattr__(self, "report_entry", self.name)

    @property
    def is_switch(self) -> bool:
        """A check box in the app, a flag without an argument on the command line."""
        return isinstance(self.default, bool)

    @property
    def help(self) -> str:
        """The CLI flag's help: the tip, then what the command line's values mean."""
        return f"{self.tip}{f' ({self.flag_note})' if self.flag_note else ''}".replace("%", "%%")

    def refusal(self, value: Any) -> str:
        """Why ``value`` is not a value of this setting, or "" when it is."""
        if self.is_switch:
            return "" if isinstance(value, bool) else f"{self.what} must be true or false, got {value!r}"
        if self.bounds is not None:
            low, high = self.bounds
            number = int | float if not self.whole else int
            if (
                isinstance(value, bool)
                or not isinstance(value, number)
                or not math.isfinite(value)
                or not low <= value <= high
            ):
                if self.whole:
                    return f"{self.what} must be a whole number from {low:g} to {high:g}, got {value!r}"
                unit = f" of {self.unit}" if self.unit else ""
                return f"{self.what} must be a number{unit} between {low:g} and {high:g}, got {value!r}"
            return ""
        if value in self.values and not isinstance(value, bool):
            return ""
        named = [str(v) for v in self.values if v is not None] + (["none"] if None in self.values else [])
        listing = ", ".join(named[:-1]) + f" or {named[-1]}" if len(named) > 1 else named[0]
        return f"{self.what} must be one of {listing}, got {value!r}"

    def on_wire(self, config: Any) -> bool:
        """Whether ``config.to_dict()`` carries this setting."""
        if not self.omitted_at_default or getattr(config, self.name) != self.default:
            return True
        return self.kept_while is not None and getattr(config, self.kept_while[0]) == self.kept_while[1]


_MIXED = "mixed (int8 + float)"
SETTING_ROWS: tuple[SettingRow, ...] = (
    SettingRow(
        "tf32",
        "TF32",
        "TF32 tensor cores for fp32 convolutions and matmuls (NVIDIA, compute capability 8.0+)",
        False,
    ),
    SettingRow(
        "channels_last_3d",
        "Channels-last 3D",
        "Weights and inputs in channels-last 3D (NDHWC) memory format",
        False,
        flag="--channels-last",
    ),
    SettingRow(
        "autocast",
        "Autocast",
        "Mixed precision: bf16 or fp16 activations, fp32 results",
        None,
        choices=(("Off (fp32)", None), ("bf16", "bf16"), ("fp16", "fp16")),
    ),
    SettingRow(
        "attention",
        "Attention",
        "SDPA routes the attention blocks through torch.nn.functional.scaled_dot_product_attention",
        "default",
        choices=(("Default", "default"), ("SDPA", "sdpa")),
        flag="--sdpa",
        flag_value="sdpa",
    ),
    SettingRow(
        "compile_mode",
        "Compile",
        "torch.compile the U-Net (the first run compiles, which takes a while)",
        None,
        choices=(
            ("Off (eager)", None),
            ("default", "default"),
            ("reduce-overhead", "reduce-overhead"),
            ("max-autotune", "max-autotune"),
        ),
        what="compile mode",
        flag="--compile",
    ),
    SettingRow(
        "cuda_graphs",
        "CUDA graphs",
        "Capture the U-Net call once as a CUDA graph and replay it every step (CUDA only)",
        False,
    ),
    SettingRow(
        "quantization",
        "Quantization",
        "Post-training quantization of the U-Net: int8 (x86 CPU), fp8 (Ada/Hopper GPU Linear layers), mixed "
        "(int8 except the layers needed to meet the PSNR budget)",
        None,
        choices=(("Off", None), ("int8", "int8"), ("fp8", "fp8"), (_MIXED, "mixed")),
        flag="--quantize",
        per_model=True,
    ),
    SettingRow(
        "psnr_budget_db",
        "PSNR budget",
        "Mixed quantization keeps enough layers in float for the final volume to stay above this PSNR against "
        "fp32",
        40.0,
        bounds=(10.0, 150.0),
        unit="dB",
        what="PSNR budget",
        flag="--psnr-budget",
        metavar="DB",
        report_entry=None,
        budget_of="quantization",
    ),
    SettingRow(
        "unet_subpixel",
        "Sub-pixel upsampling",
        "Compute the U-Net's upsampling convolutions at the low resolution (sub-pixel): the same result up to "
        "float rounding in about a third of their multiply-adds; combines with int8 and mixed",
        False,
        omitted_at_default=True,
    ),
    SettingRow(
        "streamed_decode",
        "Streamed decode",
        "Decode the latent layer by layer in slabs: the same result, bounded peak memory",
        False,
        part=DECODE,
    ),
    SettingRow(
        "decoder_autocast",
        "Decoder precision",
        "Precision of the autoencoder's decoder; 'Same as autocast' follows the U-Net's autocast",
        None,
        part=DECODER,
        choices=(("Same as autocast", None), ("fp32", "fp32"), ("bf16", "bf16"), ("fp16", "fp16")),
        what="decoder autocast",
        flag_note="left out: the same as --autocast",
        omitted_at_default=True,
    ),
    SettingRow(
        "decoder_quantization",
        "Decoder quantization",
        "int8 decoder convolutions (x86 CPU), or mixed: int8 except the layers needed to keep the decoded "
        "volume within the decoder PSNR budget of fp32",
        None,
        part=DECODER,
        choices=(("Off", None), ("int8", "int8"), (_MIXED, "mixed")),
        what="decoder quantization",
        flag="--decoder-quantize",
        omitted_at_default=True,
        per_model=True,
    ),
    SettingRow(
        "decoder_channels_last",
        "Decoder channels-last",
        "Decoder weights and activations in NDHWC (faster oneDNN convolutions on x86 CPUs)",
        False,
        part=DECODER,
        what="decoder channels-last",
        omitted_at_default=True,
    ),
    SettingRow(
        "decoder_psnr_budget_db",
        "Decoder PSNR budget",
        "Mixed decoder quantization keeps enough layers in float for the decoded volume to stay above this "
        "PSNR against fp32",
        40.0,
        part=DECODER,
        bounds=(10.0, 150.0),
        unit="dB",
        what="decoder PSNR budget",
        flag="--decoder-psnr-budget",
        metavar="DB",
        report_entry=None,
        omitted_at_default=True,
        kept_while=("decoder_quantization", "mixed"),
        budget_of="decoder_quantization",
    ),
    SettingRow(
        "step_cache_interval",
        "Step caching",
        "Reuse the U-Net's deep features between full passes and recompute only the top levels (DeepCache): "
        "faster, not exact; its quality cost is measured by volsynth tune and python -m benchmarks.step_cache",
        1,
        choices=(("Off (every step full)", 1), *((f"Full pass every {k} steps", k) for k in (2, 3, 4, 5, 6))),
        bounds=(1, STEP_CACHE_MAX_INTERVAL),
        whole=True,
        what="step cache interval",
        metavar="K",
        flag_note="a full U-Net pass every K-th step, the steps between reuse its deep features; 1: off",
        report_entry="step_cache",
        omitted_at_default=True,
    ),
    SettingRow(
        "step_cache_level",
        "Step cache level",
        "How many top levels a cached step recomputes: 1 saves the most and changes the volume most",
        1,
        choices=(("Level 1 (most saved)", 1), ("Level 2", 2), ("Level 3", 3)),
        bounds=(1, 16),
        whole=True,
        what="step cache level",
        metavar="L",
        flag_note="at most the U-Net's number of levels",
        report_entry=None,  # reported with the interval, as one "step_cache" entry
        omitted_at_default=True,
        only_with="step_cache_interval",
    ),
    SettingRow(
        "step_cache_forecast",
        "Cached features",
        "What a cached step uses for the deep features: those of the last full pass as they are, or extrapolated "
        "along their trend over the last two full passes (first-order forecasting: far closer to the uncached "
        "run for the same speed)",
        False,
        choices=(("Held from the last full pass", False), ("Forecast from the last two", True)),
        what="step cache forecast",
        flag_note="with --step-cache-interval above 1",
        report_entry=None,  # reported with the interval, as one "step_cache" entry
        omitted_at_default=True,
        only_with="step_cache_interval",
    ),
    SettingRow(
        "allow_slower",
        "Run although slower here",
        "Run settings that are expected to be slower than fp32 on this machine (reduced precision without native "
        "kernels, or measured slower here) instead of refusing them; the result records it",
        False,
        part=OVERRIDE,
        omitted_at_default=True,
    ),
)
SETTINGS: dict[str, SettingRow] = {row.name: row for row in SETTING_ROWS}


@dataclass(frozen=True)
class OptimizationConfig:
    """What to change relative to plain fp32 NCDHW eager execution.

    One field per row of ``SETTING_ROWS``, whose tip says what it does; values are checked against the rows,
    then the combinations that are wrong on every device are refused here (the device-dependent ones in
    ``engine.optimization.apply.check_combination``).

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
    step_cache_forecast: bool = False
    allow_slower: bool = False

    def __post_init__(self) -> None:
        for row in SETTING_ROWS:
            refusal = row.refusal(getattr(self, row.name))
            if refusal:
                raise InvalidRequest(refusal)
        # Combinations that are wrong on every device; device-dependent ones are in check_combination.
        if self.step_caching and (self.compile_mode or self.cuda_graphs):
            raise InvalidRequest(
                "step caching runs the U-Net's levels separately, while torch.compile and CUDA graphs capture "
                "the whole call; choose either step caching or compilation / CUDA graphs"
            )
        decoder_dtype = self.decoder_autocast or self.autocast
        if self.decoder_quantization and decoder_dtype == "fp16":
            raise InvalidRequest(
                "int8 decoder quantization runs on x86 CPUs, which have no fast fp16 kernels; use bf16 "
                "(or fp32) for the decoder with int8"
            )
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
        return any(
            getattr(self, row.name) != row.default
            for row in SETTING_ROWS
            if row.part == DECODER and not row.budget_of
        )

    def to_dict(self) -> dict[str, Any]:
        """Every setting, except those left out at their defaults (``SettingRow.omitted_at_default``)."""
        data = asdict(self)
        for row in SETTING_ROWS:
            if not row.on_wire(self):
                del data[row.name]
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
                (
                    f"cache:k{self.step_cache_interval}-l{self.step_cache_level}"
                    + ("-f" if self.step_cache_forecast else ""),
                    self.step_caching,
                ),
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
    # ... with the cached feature forecast from the last two full passes ("-f").
    **{
        f"cache:k{k}-l1-f": {"step_cache_interval": k, "step_cache_level": 1, "step_cache_forecast": True}
        for k in (3, 4, 5, 6)
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
