"""What each optimization setting does on a device, decided once per run: applies or not and why, and whether
it is expected slower than fp32 here.

``prepare`` (:mod:`engine.optimization.apply`) and ``expected_report`` decide with the same per-setting
functions (:data:`EXPECTED`), so a setting predicted not to apply carries the reason the run will give. The
decisions are typed fields (:class:`Decisions`); the report, in provenance and the UI, is written from them.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.api.optimization_config import OptimizationConfig
from engine.errors import InvalidRequest

ALLOW_SLOWER_ENV = "VOLSYNTH_ALLOW_SLOWER"  # "1": every request of this process carries the override
SUBPIXEL_NOTE = "upsampling as sub-pixel convolutions (8/27 of their multiply-adds)"
_NO_DECODER = "pixel-space model: there is no decoder"


@dataclass
class Decision:
    """What one setting did: the value asked for, whether it applied and why (or why not), and the reason it is
    expected slower than fp32 here ("" when it is not). Mutable: a compilation that fails at the first call
    turns its decision to "not applied" during the run."""

    requested: Any
    applied: bool = False
    reason: str = ""
    expected_slower: str = ""

    def entry(self) -> dict[str, Any]:
        """This decision as a report entry (provenance, the app, the CLI's prediction)."""
        entry = {"requested": self.requested, "applied": self.applied, "reason": self.reason}
        if self.expected_slower:
            entry["expected_slower"] = self.expected_slower
        return entry


def _not_requested(requested: Any = None) -> Any:
    return field(default_factory=lambda: Decision(requested))


@dataclass
class Decisions:
    """One decision per report entry, in the report's order (a setting's ``SettingRow.report_entry``); then
    what ``volsynth tune`` measured for exactly these settings and the override, when they have something to
    say."""

    tf32: Decision = _not_requested(False)
    autocast: Decision = _not_requested()
    attention: Decision = _not_requested("default")
    unet_subpixel: Decision = _not_requested(False)
    quantization: Decision = _not_requested()
    channels_last_3d: Decision = _not_requested(False)
    compile_mode: Decision = _not_requested()
    cuda_graphs: Decision = _not_requested(False)
    step_cache: Decision = _not_requested()
    streamed_decode: Decision = _not_requested(False)
    decoder_autocast: Decision = _not_requested()
    decoder_quantization: Decision = _not_requested()
    decoder_channels_last: Decision = _not_requested(False)
    measured_here: Decision | None = None
    allow_slower: Decision | None = None

    def report(self) -> dict[str, dict[str, Any]]:
        """The report: each decision's entry under its name (written from the decisions, never read back)."""
        return {
            item.name: decision.entry()
            for item in dataclasses.fields(self)
            if (decision := getattr(self, item.name)) is not None
        }

    def with_speed(self, verdict: SpeedVerdict) -> Decisions:
        """A copy marked with what ``verdict`` says is expected slower here, with its speed entries."""
        settings = {
            name: dataclasses.replace(getattr(self, name), expected_slower=verdict.slower_reason(name))
            for name in EXPECTED
        }
        return Decisions(
            **settings, measured_here=verdict.measured_here, allow_slower=verdict.allow_slower_decision()
        )


# -- expected slower here, and the combinations refused on a device --------------------------------------


@dataclass(frozen=True)
class SpeedVerdict:
    """What this machine says of a config's speed, decided once per run by :func:`check_combination` and
    read by the report: the settings expected slower than fp32 here with their reasons, whether the run carries
    the override, and what ``volsynth tune`` measured for exactly these settings."""

    slower: tuple[tuple[str, str], ...] = ()
    override: bool = False
    override_asked: bool = False
    measured_here: Decision | None = None

    def slower_reason(self, name: str) -> str:
        return next((reason for entry, reason in self.slower if entry == name), "")

    def allow_slower_decision(self) -> Decision | None:
        """The override's decision, when it was asked for or made a difference (the process-wide override is
        recorded where it did)."""
        slower = self.slower if self.override else ()
        if not (self.override_asked or slower):
            return None
        return Decision(
            True,
            bool(slower),
            (
                "run although expected slower here: " + "; ".join(reason for _, reason in slower)
                if slower
                else "nothing asked for is expected slower here"
            ),
        )


_SPEED_NAMES = {
    "autocast": "autocast",
    "decoder_autocast": "decoder precision",
    "measured_here": "these settings",
}


def check_combination(config: OptimizationConfig, device, *, probe=None, measured=None) -> SpeedVerdict:
    """Refuse settings that make no sense on ``device`` (raises ``InvalidRequest`` saying what to change);
    returns the speed verdict it checked, for the run's report (so the check runs once per run).

    Settings that merely have no effect here (TF32 on a CPU) are not refused; the report says why. Settings
    expected to run slower than fp32 here (:func:`slower_here`) are refused unless the request carries the
    override (``allow_slower``, or ``VOLSYNTH_ALLOW_SLOWER=1`` for a process that measures them on purpose).

    Args:
        probe: the machine's ``MachineProbe`` (default: this machine's; a server's is its own).
        measured: the model's stored tune result on this machine (``engine.optimization.tune_store.load_result``).
    """
    if config.cuda_graphs and device.type != "cuda":
        raise InvalidRequest(
            f"CUDA graphs need an NVIDIA GPU; this run is on {device.type}. Turn CUDA graphs off "
            "or choose a CUDA device"
        )
    verdict = speed_verdict(config, device, probe=probe, measured=measured)
    if verdict.slower and not verdict.override:
        what = "; ".join(f"{_SPEED_NAMES.get(name, name)}: {reason}" for name, reason in verdict.slower)
        raise InvalidRequest(
            f"expected slower than fp32 here - {what}. Use fp32 or the setting measured fastest here "
            "(volsynth tune), or run it anyway with --allow-slower (the app: 'Run although slower here')"
        )
    return verdict


def override_requested(config: OptimizationConfig) -> bool:
    return config.allow_slower or os.environ.get(ALLOW_SLOWER_ENV) == "1"


def speed_verdict(config: OptimizationConfig, device, *, probe=None, measured=None) -> SpeedVerdict:
    """:func:`slower_here`, the override and the measured row of ``config``, looked up once."""
    return SpeedVerdict(
        slower=tuple(slower_here(config, device, probe=probe, measured=measured)),
        override=override_requested(config),
        override_asked=config.allow_slower,
        measured_here=_measured_decision(config, measured),
    )


def slower_here(config: OptimizationConfig, device, *, probe=None, measured=None) -> list[tuple[str, str]]:
    """The settings of ``config`` expected to run slower than fp32 on ``device``, each with the reason.

    Two sources, decided here only: the hardware probe (reduced precision without native kernels:
    ``engine.machine.probe.autocast_slower_reason``) and this machine's measurements of the model (a row
    with exactly these settings that ``volsynth tune`` measured slower than fp32 end to end by the noise
    rule).
    """
    from engine.machine.probe import autocast_slower_reason, probe_machine
    from engine.optimization import tune_store

    if device.type not in ("cpu", "cuda"):
        return []
    probe = probe or probe_machine()
    found: list[tuple[str, str]] = []
    decoder_dtype = config.decoder_autocast
    if config.autocast:
        reason = autocast_slower_reason(probe, device.type, config.autocast, device.index)
        if reason:
            found.append(("autocast", f"{config.autocast} autocast: {reason}"))
    if decoder_dtype in ("bf16", "fp16") and decoder_dtype != config.autocast:
        reason = autocast_slower_reason(probe, device.type, decoder_dtype, device.index)
        if reason:
            found.append(("decoder_autocast", f"{decoder_dtype} decoder: {reason}"))
    row = tune_store.measured_row(measured, config)
    if tune_store.measured_slower(row):
        found.append(("measured_here", _measured_words(row, measured)))
    return found


def _measured_words(row, measured) -> str:
    verdict = row.get("end_to_end_verdict") or {}
    ratio = verdict.get("ratio")
    when = (measured or {}).get("created", "")
    pace = f"{ratio:.2f}x fp32's speed end to end" if isinstance(ratio, int | float) else "slower end to end"
    return f"measured {pace} on this machine (volsynth tune {when})".replace(" )", ")")


def _measured_decision(config: OptimizationConfig, measured) -> Decision | None:
    """What ``volsynth tune`` measured for exactly these settings, when it did."""
    if measured is None:
        return None
    from engine.optimization import tune_store

    row = tune_store.measured_row(measured, config)
    if row is None or "error" in row:
        return None
    verdict = row.get("end_to_end_verdict") or {}
    return Decision(
        config.settings.summary(),
        verdict.get("verdict") != "slower",
        f"{verdict.get('words', '')}; PSNR {row.get('psnr_db', float('nan')):.1f} dB vs fp32 "
        f"(volsynth tune, {measured.get('created', '')})",
    )


# -- what applies where: one function per report entry, shared by prepare and expected_report -----------


@dataclass(frozen=True)
class Where:
    """What a setting's decision depends on besides the config: the device, the machine's probe and whether
    the model has a decoder. The counts only the weights can tell (attention blocks switched to SDPA, U-Net
    blocks rewritten, U-Net levels) are None when predicting without the model."""

    device: Any
    probe: Any
    has_decoder: bool = True
    sdpa_blocks: int | None = None
    subpixel_blocks: int | None = None
    unet_levels: int | None = None


def _gpu_capability(device, probe) -> tuple[int, int]:
    gpu = probe.gpu(device.index)
    if gpu is not None:
        return gpu.compute_capability
    import torch

    return torch.cuda.get_device_capability(device)


def tf32_decision(config: OptimizationConfig, where: Where) -> Decision:
    device = where.device
    is_cuda = device.type == "cuda"
    if not config.tf32:
        return Decision(False, False, "fp32 convolutions and matmuls forced to IEEE fp32" if is_cuda else "")
    if is_cuda:
        capability = _gpu_capability(device, where.probe)
        if capability >= (8, 0):
            return Decision(
                True,
                True,
                f"convolutions and matmuls in TF32 (compute capability {capability[0]}.{capability[1]})",
            )
        place = f"this GPU is {capability[0]}.{capability[1]}"
    else:
        place = f"this run is on {device.type}"
    return Decision(True, False, f"TF32 needs an NVIDIA GPU of compute capability 8.0+; {place}")


def autocast_decision(config: OptimizationConfig, where: Where) -> Decision:
    if not config.autocast:
        return Decision(None)
    ok, reason = autocast_support(config.autocast, where.device, where.probe)
    return Decision(config.autocast, ok, reason)


def attention_decision(config: OptimizationConfig, where: Where) -> Decision:
    if config.attention != "sdpa":
        return Decision("default")
    switched = where.sdpa_blocks
    if switched == 0:
        return Decision("sdpa", False, "the model has no attention blocks that can use SDPA")
    count = "the model's" if switched is None else str(switched)
    return Decision(
        "sdpa", True, f"{count} attention block(s) use torch.nn.functional.scaled_dot_product_attention"
    )


def unet_subpixel_decision(config: OptimizationConfig, where: Where) -> Decision:
    if not config.unet_subpixel:
        return Decision(False)
    rewritten = where.subpixel_blocks
    if rewritten == 0:
        return Decision(True, False, "the U-Net has no nearest-x2 + 3x3x3 upsampling convolution")
    count = "the U-Net's" if rewritten is None else str(rewritten)
    return Decision(
        True,
        True,
        f"{count} upsampling block(s) as sub-pixel convolutions at the low resolution (nearest x2 + 3x3x3 "
        "= eight 2x2x2 convolutions: the same result up to float rounding, about a third of their "
        "multiply-adds)",
    )


def quantization_support(config: OptimizationConfig, device) -> tuple[bool, str]:
    """Whether ``config.quantization`` has kernels on ``device``: (True, int8 engine or fp8 note) or (False, why)."""
    from engine import quantization as q

    return q.fp8_support(device) if config.quantization == "fp8" else q.int8_support(device)


def quantization_decision(config: OptimizationConfig, where: Where) -> Decision:
    """What quantization will do here; ``engine.optimization.apply`` replaces it with what it did."""
    mode = config.quantization
    if not mode:
        return Decision(None)
    ok, why = quantization_support(config, where.device)
    if not ok:
        return Decision(mode, False, why)
    if mode == "fp8":
        plan = "Linear layers with fp8-compatible shapes in fp8 e4m3; convolutions keep their precision"
    elif mode == "int8":
        plan = f"U-Net Conv3d and Linear layers in int8 ({why} engine), calibrated when the model is prepared"
    else:
        plan = (
            f"int8 except the layers needed to keep the volume within {config.psnr_budget_db:g} dB of fp32, "
            "found by a calibration search when the model is prepared (slow the first time)"
        )
    return Decision(mode, True, plan)


def channels_last_decision(config: OptimizationConfig, where: Where) -> Decision:
    if not config.channels_last_3d:
        return Decision(False)
    device = where.device
    kept = conv_keeps_channels_last(device)
    return Decision(
        True,
        True,
        "weights and inputs in NDHWC"
        + (
            ""
            if kept
            else (
                f"; this build's Conv3d returns NCDHW on {device.type}, so activations fall back to NCDHW after each conv"
            )
        ),
    )


def compile_decision(config: OptimizationConfig, where: Where) -> Decision:
    if not config.compile_mode:
        return Decision(None)
    ok, why = _compile_support(where.device)
    if not ok:
        return Decision(config.compile_mode, False, why)
    return Decision(
        config.compile_mode,
        True,
        f"torch.compile(mode={config.compile_mode!r})"
        + (
            "; no CUDA graphs off CUDA"
            if config.compile_mode != "default" and where.device.type != "cuda"
            else ""
        ),
    )


def cuda_graphs_decision(config: OptimizationConfig, where: Where) -> Decision:
    if not config.cuda_graphs:  # when requested, check_combination has already refused it off CUDA
        return Decision(False)
    return Decision(True, True, "U-Net captured once per input shape, replayed each step")


def step_cache_decision(config: OptimizationConfig, where: Where) -> Decision:
    if not config.step_caching:
        return Decision(None)
    k, level = config.step_cache_interval, config.step_cache_level
    requested = f"every {k} steps, level {level}" + (", forecast" if config.step_cache_forecast else "")
    if where.unet_levels == 0:
        return Decision(
            requested, False, "the denoiser is not a MONAI diffusion U-Net, which step caching needs"
        )
    reused = (
        "extrapolate the deeper features linearly from the last two full passes"
        if config.step_cache_forecast
        else "reuse the deeper features of the last full pass"
    )
    return Decision(
        requested,
        True,
        f"a full U-Net pass every {k} steps (the first of a run included); the steps between recompute the top "
        f"{level} level(s) and {reused} (DeepCache-style; not exact: "
        "its quality cost is measured against the uncached run by volsynth tune)",
    )


def streamed_decode_decision(config: OptimizationConfig, where: Where) -> Decision:
    if not config.streamed_decode:
        return Decision(False)
    if not where.has_decoder:
        return Decision(True, False, "pixel-space model: there is no decoder to stream")
    return Decision(
        True,
        True,
        "exact decode layer by layer in slabs (engine/optimization/streamed_decode.py): same result, at "
        "most two full-resolution activations",
    )


def decoder_autocast_decision(config: OptimizationConfig, where: Where) -> Decision:
    dtype = config.decoder_autocast
    if dtype is None:
        return Decision(None)
    if not where.has_decoder:
        return Decision(dtype, False, _NO_DECODER)
    if dtype == "fp32":
        return Decision(dtype, True, f"the decoder in fp32 whatever the U-Net runs in; {SUBPIXEL_NOTE}")
    ok, reason = autocast_support(dtype, where.device, where.probe)
    return Decision(dtype, ok, f"{reason} for the decoder; {SUBPIXEL_NOTE}" if ok else reason)


def decoder_quantization_decision(config: OptimizationConfig, where: Where) -> Decision:
    """What decoder quantization will do here; ``engine.optimization.apply`` replaces it with what it did."""
    from engine import quantization as q

    mode = config.decoder_quantization
    if not mode:
        return Decision(None)
    if not where.has_decoder:
        return Decision(mode, False, _NO_DECODER)
    ok, why = q.int8_support(where.device)
    if not ok:
        return Decision(mode, False, why)
    if mode == "int8":
        plan = f"every decoder convolution in int8 ({why} engine), calibrated when the model is prepared"
    else:
        plan = (
            f"decoder convolutions in int8 except those needed to keep the decoded volume within "
            f"{config.decoder_psnr_budget_db:g} dB of fp32, found by a search on a calibration decode when the "
            "model is prepared"
        )
    return Decision(mode, True, plan)


def decoder_channels_last_decision(config: OptimizationConfig, where: Where) -> Decision:
    if not config.decoder_channels_last:
        return Decision(False)
    if not where.has_decoder:
        return Decision(True, False, _NO_DECODER)
    if where.device.type != "cpu":
        return Decision(
            True,
            True,
            f"decoder weights and activations in NDHWC on {where.device.type} (measured faster only with oneDNN on "
            "x86 CPUs so far)",
        )
    return Decision(
        True,
        True,
        "decoder weights and activations in NDHWC: oneDNN's fp32, bf16 and int8 convolutions run faster "
        "on it on x86 CPUs (the streamed decode stores its activations NDHWC)",
    )


# The decision of each report entry (``SettingRow.report_entry``) from the config and where it runs: a new
# setting with an entry of its own adds its function here and its field to ``Decisions``.
EXPECTED: dict[str, Callable[[OptimizationConfig, Where], Decision]] = {
    "tf32": tf32_decision,
    "autocast": autocast_decision,
    "attention": attention_decision,
    "unet_subpixel": unet_subpixel_decision,
    "quantization": quantization_decision,
    "channels_last_3d": channels_last_decision,
    "compile_mode": compile_decision,
    "cuda_graphs": cuda_graphs_decision,
    "step_cache": step_cache_decision,
    "streamed_decode": streamed_decode_decision,
    "decoder_autocast": decoder_autocast_decision,
    "decoder_quantization": decoder_quantization_decision,
    "decoder_channels_last": decoder_channels_last_decision,
}


def expected_decisions(config: OptimizationConfig, where: Where) -> Decisions:
    """Every setting's decision on ``where``, before anything is applied."""
    return Decisions(**{name: decide(config, where) for name, decide in EXPECTED.items()})


def autocast_support(dtype: str, device, probe) -> tuple[bool, str]:
    if device.type == "cuda":
        gpu = probe.gpu(device.index)
        name = gpu.name if gpu is not None else str(device)
        capability = _gpu_capability(device, probe)
        if dtype == "bf16" and capability < (8, 0):
            return False, (
                f"{name} has no bf16 support (needs compute capability 8.0+; it is "
                f"{capability[0]}.{capability[1]})"
            )
        return True, f"{dtype} autocast on {name}"
    if device.type == "cpu":
        cpu = probe.cpu
        native = cpu.native_bf16 if dtype == "bf16" else cpu.native_fp16
        kernels = "native" if native else "no native"
        return True, f"{dtype} autocast on the CPU (oneDNN {cpu.onednn_isa}: {kernels} {dtype} kernels)"
    if device.type == "mps":
        return True, f"{dtype} autocast on Apple Metal"
    return False, f"autocast is not supported on {device.type}"


def _compile_support(device) -> tuple[bool, str]:
    import torch

    if not hasattr(torch, "compile"):
        return False, "this PyTorch has no torch.compile"
    if device.type == "cpu" and not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
        return False, "torch.compile on the CPU needs a C++ compiler (g++ or clang++), none found"
    if device.type == "mps":
        return False, "torch.compile does not support Apple Metal for these networks yet"
    return True, ""


_CL_PROBE: dict[str, bool] = {}


def conv_keeps_channels_last(device) -> bool:
    """Whether this build's Conv3d returns channels-last output for channels-last input on ``device``."""
    import torch

    key = device.type
    if key not in _CL_PROBE:
        conv = torch.nn.Conv3d(8, 8, 3, padding=1).to(device).to(memory_format=torch.channels_last_3d)
        x = torch.zeros(1, 8, 4, 4, 4, device=device).contiguous(memory_format=torch.channels_last_3d)
        with torch.inference_mode():
            _CL_PROBE[key] = conv(x).is_contiguous(memory_format=torch.channels_last_3d)
    return _CL_PROBE[key]
