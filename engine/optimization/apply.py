"""Speed and precision settings, and the one place they are applied to a model.

Each setting's decision (applied on this device or not, and why: :mod:`engine.optimization.decisions`) is a
typed field of the prepared model, and its report, for the provenance record and the UI, is written from them.
Combinations that cannot make sense are refused with ``InvalidRequest`` before any work starts, once per run
(:func:`check_combination`, whose speed verdict the run then carries). :func:`expected_report` predicts the
report without a model (the app shows it live), from the same per-setting functions ``prepare`` uses.

``prepare`` never changes the cached fp32 ``LoadedModel``: anything that rewrites modules or weights
(channels-last, SDPA, quantization, compilation) works on a deep copy. Prepared variants are cached per
(model, config, device), because int8 calibration and the mixed-precision search run the sampling loop.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.api.optimization_config import OptimizationConfig
from engine.errors import InvalidRequest
from engine.machine.probe import probe_machine
from engine.metrics.image import psnr
from engine.optimization import calibration_cache
from engine.optimization.decisions import (  # noqa: F401 - slower_here: callers ask it here, with the rest
    Decision,
    Decisions,
    SpeedVerdict,
    Where,
    check_combination,
    expected_decisions,
    quantization_support,
    slower_here,
    step_cache_decision,
    unet_subpixel_decision,
)

# Calibration for int8 / mixed: its own seed (not a user's), a few steps spread over the whole schedule.
CALIBRATION_SEED = 20240917
CALIBRATION_STEPS = 4  # module-level so tests can shorten it
# The decoder is calibrated (int8 ranges, the mixed plan's search) on a centre crop of the calibration latent
# at most this many latent voxels per axis: it is fully convolutional, and a full-size decode per trial would
# make the search take hours on a CPU.
DECODER_CALIBRATION_CROP = 8


# -- the prepared model ----------------------------------------------------------------------------------


@dataclass
class PreparedModel:
    """A loaded model with an ``OptimizationConfig`` applied, plus what each setting did (``decisions``).

    ``report`` maps each setting to ``{"requested": ..., "applied": bool, "reason": str}``, written from the
    decisions (a compilation that failed at its first call is reported as run eager).
    The sampling loop calls only ``denoiser(x, t, context)``, ``decode(z)`` and ``autocast()``, so new
    settings change this class, never the loop.
    """

    unet: Any
    autoencoder: Any
    config: OptimizationConfig
    device: Any
    decisions: Decisions = field(default_factory=Decisions)
    unet_call: Any = None  # the callable run per step (compiled / CUDA-graphed U-Net); default: unet
    details: dict[str, Any] = field(default_factory=dict)  # extra facts for benchmarks (mixed plan, ...)
    compiled: _CompiledWithFallback | None = None  # the compiled U-Net's call, which may fall back to eager

    @property
    def report(self) -> dict[str, dict[str, Any]]:
        decisions = self.decisions
        if self.compiled is not None and self.compiled.failure:
            failed = dataclasses.replace(
                decisions.compile_mode,
                applied=False,
                reason=f"torch.compile failed, ran eager: {self.compiled.failure}",
            )
            decisions = dataclasses.replace(decisions, compile_mode=failed)
        return decisions.report()

    def autocast(self):
        import torch

        if self.config.autocast and self.decisions.autocast.applied:
            dtype = torch.bfloat16 if self.config.autocast == "bf16" else torch.float16
            return torch.autocast(device_type=self.device.type, dtype=dtype)
        return contextlib.nullcontext()

    def precision(self):
        """TF32 on/off for this call only: the flags are process-wide, and other runs may want IEEE fp32."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        return _fp32_precision("tf32" if self.decisions.tf32.applied else "ieee")

    def prepare_input(self, x):
        import torch

        if self.decisions.channels_last_3d.applied and x.dim() == 5:
            return x.contiguous(memory_format=torch.channels_last_3d)
        return x

    def denoiser(self, x, timesteps, context=None):
        with self.precision(), self.autocast():
            x = self.prepare_input(x)
            if self.unet_call is not None:
                out = self.unet_call(x, timesteps, context)
            else:
                out = self.unet(x, timesteps=timesteps, context=context)
        return out.float()

    def decoder_autocast(self):
        """The decoder's precision: its own setting, or ``autocast`` when it has none (as before)."""
        import torch

        dtype = self.config.decoder_autocast
        if dtype is None:
            return self.autocast()
        if dtype == "fp32" or not self.decisions.decoder_autocast.applied:
            return torch.autocast(device_type=self.device.type, enabled=False)
        return torch.autocast(
            device_type=self.device.type, dtype=torch.bfloat16 if dtype == "bf16" else torch.float16
        )

    def prepare_decoder_input(self, z):
        import torch

        channels_last = (
            self.decisions.decoder_channels_last.applied or self.decisions.channels_last_3d.applied
        )
        if channels_last and z.dim() == 5:
            return z.contiguous(memory_format=torch.channels_last_3d)
        return z

    def decode(self, z):
        with self.precision(), self.decoder_autocast():
            z = self.prepare_decoder_input(z)
            if self.decisions.streamed_decode.applied:
                from engine.optimization.streamed_decode import streamed_decode

                stats: dict[str, Any] = {}
                out = streamed_decode(self.autoencoder, z, stats=stats)
                self.details["streamed_decode"] = stats
                return out.float()
            out = self.autoencoder.decode_stage_2_outputs(z)
        return out.float().contiguous()


@contextlib.contextmanager
def _fp32_precision(mode: str):
    """Set cuBLAS and cuDNN fp32 precision ("tf32" or "ieee"), restoring the previous values after.

    PyTorch >= 2.9 has ``fp32_precision``; mixing it with the legacy ``allow_tf32`` flags is an error there,
    so the legacy flags are used only on older builds. cuDNN's legacy default is TF32 for convolutions,
    which is why "ieee" is set explicitly for fp32 runs.
    """
    import torch

    matmul, conv = torch.backends.cuda.matmul, getattr(torch.backends.cudnn, "conv", None)
    if hasattr(matmul, "fp32_precision") and conv is not None and hasattr(conv, "fp32_precision"):
        saved = (matmul.fp32_precision, conv.fp32_precision)
        matmul.fp32_precision = conv.fp32_precision = mode
        try:
            yield
        finally:
            matmul.fp32_precision, conv.fp32_precision = saved
    else:  # pragma: no cover - torch < 2.9
        saved = (matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = mode == "tf32"
        try:
            yield
        finally:
            matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


class _CompiledWithFallback:
    """Calls the compiled U-Net; if compilation fails at the first call, runs eager and keeps why (``failure``,
    which the prepared model's report says)."""

    def __init__(self, compiled, eager):
        self.compiled, self.eager = compiled, eager
        self.failure = ""

    def __call__(self, x, timesteps, context):
        if not self.failure:
            try:
                return self.compiled(x, timesteps=timesteps, context=context)
            except Exception as exc:  # noqa: BLE001 - any compiler failure means "run eager", reported
                self.failure = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return self.eager(x, timesteps=timesteps, context=context)


class _CudaGraphed:
    """Replays a captured CUDA graph of the U-Net per input signature (shapes, dtypes, context or not).

    Inputs are copied into static buffers and the output is cloned out, because a replay overwrites both.
    """

    WARMUP = 3

    def __init__(self, fn):
        self.fn = fn
        self.graphs: dict[tuple, tuple] = {}

    def __call__(self, x, timesteps, context):
        import torch

        key = (
            tuple(x.shape),
            x.dtype,
            x.stride(),
            tuple(timesteps.shape),
            None if context is None else (tuple(context.shape), context.dtype),
        )
        entry = self.graphs.get(key)
        if entry is None:
            static = [x.clone(), timesteps.clone(), None if context is None else context.clone()]
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(self.WARMUP):  # warm-up outside capture: cuDNN autotuning, lazy allocations
                    self.fn(static[0], timesteps=static[1], context=static[2])
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self.fn(static[0], timesteps=static[1], context=static[2])
            entry = self.graphs[key] = (graph, static, out)
        graph, static, out = entry
        static[0].copy_(x)
        static[1].copy_(timesteps)
        if context is not None:
            static[2].copy_(context)
        graph.replay()
        return out.clone()


# -- prepare ---------------------------------------------------------------------------------------------

_cache_lock = threading.Lock()
_cache: dict[tuple, tuple[weakref.ref, PreparedModel]] = {}


def prepare(
    model,
    config: OptimizationConfig,
    device,
    *,
    use_cache: bool = True,
    measured=None,
    verdict: SpeedVerdict | None = None,
) -> PreparedModel:
    """Apply ``config`` to ``model`` (a LoadedModel already on ``device``).

    Settings that cannot apply here are reported with the reason instead of failing; combinations that
    make no sense raise ``InvalidRequest``, as do settings expected slower here without the override
    (``measured``: the model's tune result on this machine, see ``check_combination``). ``verdict``: what
    ``check_combination`` returned when the run checked the settings before loading (it is not checked
    again). ``model`` itself is never modified.
    """
    verdict = verdict or check_combination(config, device, measured=measured)
    key = (id(model), config, str(device))
    prepared = None
    if use_cache:
        with _cache_lock:
            hit = _cache.get(key)
            if hit is not None and hit[0]() is model:
                prepared = hit[1]
    if prepared is None:
        prepared = _prepare(model, config, device)
        if use_cache:
            with _cache_lock:
                _cache.clear()  # one prepared variant at a time: 3D U-Nets are large
                _cache[key] = (weakref.ref(model), prepared)
    # Each run gets its own decisions, marked with this run's speed verdict; the modules are shared.
    return dataclasses.replace(prepared, decisions=prepared.decisions.with_speed(verdict))


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


def _prepare(model, config: OptimizationConfig, device) -> PreparedModel:
    """The modules rewritten for ``config`` and what each setting did (before this run's speed verdict)."""
    import torch

    details: dict[str, Any] = {}
    unet, autoencoder = model.unet, model.autoencoder
    has_decoder = autoencoder is not None
    # Everything below rewrites modules: work on copies, never on the cached fp32 model.
    rewrites_unet = (
        config.channels_last_3d
        or config.attention == "sdpa"
        or config.unet_subpixel
        or config.quantization
        or config.compile_mode
        or config.cuda_graphs
    )
    if rewrites_unet:
        unet = copy.deepcopy(unet)
    if has_decoder and (config.channels_last_3d or config.optimizes_decoder):
        autoencoder = copy.deepcopy(autoencoder)

    # 1-3. TF32 and autocast are per-call contexts (PreparedModel.precision / autocast); SDPA flips MONAI's
    # use_flash_attention on every attention block (same weights).
    where = Where(
        device,
        probe_machine(),
        has_decoder,
        sdpa_blocks=_use_sdpa(unet) if config.attention == "sdpa" and unet is not None else 0,
        subpixel_blocks=0 if unet is None else None,
    )
    decisions = expected_decisions(config, where)

    # 4. Sub-pixel upsampling and quantization (before channels-last and compile: they replace modules).
    # int8 calibration and the mixed plan are measured on the plain U-Net (their caches are shared with
    # the rows without sub-pixel upsampling); the rewrite keeps the layer names, so they apply after it.
    def sub_pixel() -> None:
        if config.unet_subpixel and unet is not None:
            from engine.optimization.unet_subpixel import subpixel_rewrite_unet

            rewritten = subpixel_rewrite_unet(unet)
            decisions.unet_subpixel = unet_subpixel_decision(
                config, dataclasses.replace(where, subpixel_blocks=len(rewritten))
            )
            details["unet_subpixel_blocks"] = rewritten

    decisions.quantization = Decision(config.quantization)
    int8_path = config.quantization in ("int8", "mixed") and quantization_support(config, device)[0]
    if config.quantization and unet is not None:
        decisions.quantization = _apply_quantization(
            model, unet, config, device, decisions, details, before_int8=sub_pixel if int8_path else None
        )
    if not int8_path:
        sub_pixel()

    # 5. Channels-last 3D: weights now, inputs per call (PreparedModel.prepare_input).
    if config.channels_last_3d:
        if unet is not None:
            unet.to(memory_format=torch.channels_last_3d)
        if autoencoder is not None:
            autoencoder.to(memory_format=torch.channels_last_3d)

    # 6. Compile / CUDA graphs: wrap the call, not the module, so PreparedModel.unet stays inspectable.
    unet_call: Callable[..., Any] | None = None
    compiled: _CompiledWithFallback | None = None
    if decisions.compile_mode.applied:
        compiled = _CompiledWithFallback(torch.compile(unet, mode=config.compile_mode, dynamic=False), unet)
        unet_call = compiled
    if config.cuda_graphs:  # check_combination refused it off CUDA
        base = unet_call or (lambda x, timesteps, context: unet(x, timesteps=timesteps, context=context))
        unet_call = _CudaGraphed(base)

    # 6b. Step caching: the per-step call reuses the deep levels' features between full passes (after the
    # module rewrites above, which it calls through; the config keeps it apart from compile/graphs).
    if config.step_caching and unet is not None:
        unet_call, decisions.step_cache = _step_cached_call(unet, config, where)

    # 7-8. Streamed decode is decided per call (PreparedModel.decode). The decoder's own settings, on the
    # decoder's copy: sub-pixel upsampling, then quantization (it replaces modules, including the sub-pixel
    # ones), then channels-last.
    if has_decoder and config.optimizes_decoder:
        from engine.optimization.streamed_decode import subpixel_rewrite

        details["decoder"] = {"subpixel_upsampling_blocks": subpixel_rewrite(autoencoder)}
        if decisions.decoder_quantization.applied:
            decisions.decoder_quantization = _apply_decoder_quantization(
                model, autoencoder, config, device, decisions, details
            )
        if decisions.decoder_channels_last.applied:
            autoencoder.to(memory_format=torch.channels_last_3d)

    return PreparedModel(
        unet=unet,
        autoencoder=autoencoder,
        config=config,
        device=device,
        decisions=decisions,
        unet_call=unet_call,
        details=details,
        compiled=compiled,
    )


def expected_report(
    config: OptimizationConfig, device, spec=None, *, probe=None, measured=None
) -> dict[str, dict[str, Any]]:
    """Predict the report ``prepare`` will give for ``config`` on ``device``, without loading a model.

    Everything the device decides (TF32 needs compute capability 8.0+, no int8 kernels on GPUs, no C++
    compiler for torch.compile...) comes from the same per-setting functions ``prepare`` uses, so a setting
    predicted not to apply carries ``prepare``'s exact reason. What only the weights can tell (how many
    attention blocks switch to SDPA, which layers int8 calibration quantizes, whether compilation succeeds) is
    predicted to apply, with a reason that says it is decided when the model is prepared.

    Args:
        config: the settings to check.
        device: a ``torch.device`` or a device string ("auto", "cpu", "cuda:0", "mps").
        spec: the model's ``ModelSpec``, if known (a pixel-space model has no decoder to stream).
        probe: the machine's ``MachineProbe`` (default: this machine's).
        measured: the model's stored tune result on this machine, if any (adds ``measured_here``).

    Entries of settings expected to run slower than fp32 here carry ``expected_slower`` (the reason).

    Raises:
        InvalidRequest: the combination is refused on this device (the message ``prepare`` would raise),
            including settings expected slower here without the override.
        BackendUnavailable: ``device`` is a string naming a device this machine does not have.
    """
    if device is None or isinstance(device, str):
        from engine.machine.devices import resolve_device

        device = resolve_device(device)
    probe = probe or probe_machine()
    verdict = check_combination(config, device, probe=probe, measured=measured)
    where = Where(device, probe, has_decoder=spec is None or spec.kind != "pixel")
    return expected_decisions(config, where).with_speed(verdict).report()


def _step_cached_call(unet, config: OptimizationConfig, where: Where):
    """(the step-cached per-step callable or None, its decision); refuses a level the U-Net lacks."""
    from engine.optimization.step_cache import StepCachedUNet, unet_levels

    levels = unet_levels(unet)
    if levels is None:
        return None, step_cache_decision(config, dataclasses.replace(where, unet_levels=0))
    if config.step_cache_level > levels:
        raise InvalidRequest(
            f"step cache level {config.step_cache_level} is deeper than this U-Net's {levels} levels; "
            f"choose a level from 1 to {levels}"
        )
    decision = step_cache_decision(config, dataclasses.replace(where, unet_levels=levels))
    cached = StepCachedUNet(
        unet, config.step_cache_interval, config.step_cache_level, forecast=config.step_cache_forecast
    )
    return cached, decision


def _use_sdpa(unet) -> int:
    """Switch MONAI attention blocks to SDPA in place; returns how many were switched."""
    switched = 0
    for module in unet.modules():
        if not hasattr(module, "use_flash_attention"):
            continue
        # SDPA cannot save attention maps or add relative positional terms; leave such blocks as they are.
        if (
            getattr(module, "save_attn", False)
            or getattr(module, "rel_positional_embedding", None) is not None
        ):
            continue
        if type(module).__name__ in ("SABlock", "CrossAttentionBlock"):
            module.use_flash_attention = True
            switched += 1
    return switched


_CL_PROBE: dict[str, bool] = {}


# -- quantization ----------------------------------------------------------------------------------------


def _apply_quantization(
    model, unet, config: OptimizationConfig, device, decisions: Decisions, details, before_int8=None
) -> Decision:
    """int8, fp8 or the mixed plan for the U-Net, in place; returns what it did. ``before_int8`` (if given) runs
    after the calibration and the plan were measured on the plain U-Net and before its layers are replaced."""
    from engine import quantization as q

    mode = config.quantization
    ok, why = quantization_support(config, device)  # the same check expected_report makes
    if not ok:
        return Decision(mode, False, why)
    if mode == "fp8":
        names = q.quantize_fp8(unet)
        return Decision(
            mode,
            bool(names),
            (
                f"{len(names)} Linear layer(s) in fp8 e4m3 (torch._scaled_mm); PyTorch has no fp8 Conv3d, so "
                "convolutions keep their precision"
                if names
                else "no Linear layer has fp8-compatible shapes"
            ),
        )

    candidates = q.candidate_layers(unet)
    calibration, cached = calibration_cache.calibrate(
        unet,
        candidates,
        lambda: _run_calibration(model, unet, device, decode=False),
        {"role": "unet", "seed": CALIBRATION_SEED, "steps": CALIBRATION_STEPS, "device": device.type},
    )
    details["calibration"] = {
        "seed": CALIBRATION_SEED,
        "steps": CALIBRATION_STEPS,
        "layers_observed": len(calibration.ranges),
        "from_cache": cached,  # a one-off cost: measured once per model and machine (engine.optimization.calibration_cache)
    }
    if mode == "int8":
        if before_int8 is not None:
            before_int8()
        done = q.quantize_int8(unet, calibration, candidates)
        convs = sum(1 for n in done if n in calibration.ranges)
        return Decision(
            mode,
            bool(done),
            (
                f"{convs} Conv3d (static quint8 activations, per-channel qint8 weights) and {len(done) - convs} Linear "
                f"(dynamic int8) layer(s) of the U-Net, {why} engine; calibrated on {CALIBRATION_STEPS} steps of seed "
                f"{CALIBRATION_SEED}{' (ranges from the calibration cache)' if cached else ''}; GroupNorm, "
                "activations, attention and the decoder stay in floating point"
            ),
        )
    return _apply_mixed(model, unet, config, device, decisions, details, calibration, candidates, before_int8)


def _apply_mixed(
    model,
    unet,
    config: OptimizationConfig,
    device,
    decisions: Decisions,
    details,
    calibration,
    candidates,
    before_int8,
) -> Decision:
    """The mixed plan: a sensitivity-ranked search for the fewest float layers that meet the PSNR budget.
    Trials run in the precision the prepared model will run in (kept layers run under autocast too); the
    budget is against the fp32 volume."""
    from engine import quantization as q

    mode = config.quantization
    autocast = config.autocast if decisions.autocast.applied else None

    def run_sample(trial_unet):
        return _run_calibration(model, trial_unet, device, decode=False, autocast=autocast)

    def run_volume(trial_unet):
        return _run_calibration(model, trial_unet, device, decode=True, autocast=autocast)

    def search():
        # The budget is against fp32; without autocast the plan's own float run is that volume already.
        reference = _run_calibration(model, unet, device, decode=True) if autocast else None
        return q.mixed_precision_plan(
            unet,
            calibration,
            candidates,
            config.psnr_budget_db,
            run_sample,
            run_volume,
            reference_volume=reference,
        )

    # The search is a one-off cost (a sampling run per layer): kept per weights, floor, machine and versions.
    judged_on = (
        "final volume" if model.autoencoder is not None or model.spec.kind != "latent" else "final latent"
    )
    plan, plan_cached, search_s = calibration_cache.mixed_plan(
        unet,
        {
            "role": "unet-mixed",
            "budget_db": config.psnr_budget_db,
            "autocast": autocast,
            "judged_on": judged_on,
            "latent_shape": list(model.spec.latent_shape or ()),
            "seed": CALIBRATION_SEED,
            "steps": CALIBRATION_STEPS,
            "device": device.type,
            "layers": candidates,
        },
        search,
    )
    if before_int8 is not None:
        before_int8()
    q.quantize_int8(unet, calibration, plan.quantized)
    details["mixed_plan"] = {**plan.record(), "from_cache": plan_cached, "search_s": search_s}
    if not plan.quantized and plan.float_psnr_db < config.psnr_budget_db:
        return Decision(
            mode,
            False,
            (
                f"the {judged_on} is already at {plan.float_psnr_db:.1f} dB vs fp32 with {autocast} autocast alone, "
                f"below the {config.psnr_budget_db:g} dB budget, and int8 only adds error; lower the budget or turn "
                "autocast off"
            ),
        )
    achieved = "lossless" if math.isinf(plan.achieved_psnr_db) else f"{plan.achieved_psnr_db:.1f} dB"
    kept_dtype = autocast or "fp32"
    return Decision(
        mode,
        bool(plan.quantized),
        (
            f"{len(plan.quantized)} of {len(candidates)} layers int8 ({100 * plan.quantized_share:.0f}% of the U-Net's "
            f"compute), {len(plan.kept)} kept in {kept_dtype} ({len(plan.skipped_small)} of them below "
            f"{100 * q.MIN_MIXED_SHARE:g}% of the compute each, not searched); {judged_on} {achieved} vs fp32 on the "
            f"calibration run (budget {config.psnr_budget_db:g} dB, seed {CALIBRATION_SEED}, {CALIBRATION_STEPS} steps)"
            + (
                f"; plan from the cache (its search took {search_s:.0f} s once)"
                if plan_cached
                else f"; plan searched in {search_s:.0f} s (kept for the next run)"
            )
        ),
    )


def _decoder_dtype(config: OptimizationConfig, decisions: Decisions) -> str | None:
    """The autocast dtype the prepared decoder runs in (None: fp32)."""
    if config.decoder_autocast is None:
        return config.autocast if decisions.autocast.applied else None
    if config.decoder_autocast == "fp32" or not decisions.decoder_autocast.applied:
        return None
    return config.decoder_autocast


def decoder_calibration_latent(model, device):
    """The latent the decoder is calibrated on: a centre crop of the final latent of the calibration
    sampling run (what the decoder will be given), or of seeded noise when no U-Net is loaded."""
    import torch

    spec = model.spec
    if model.unet is not None:
        # The calibration sampling run is a one-off cost: its final latent is kept with the U-Net's ranges.
        z = calibration_cache.latent(
            model.unet,
            {"role": "decoder-latent", "seed": CALIBRATION_SEED, "steps": CALIBRATION_STEPS},
            lambda: _run_calibration(model, model.unet, device, decode=False),  # already / scale_factor
        )
    else:
        noise = torch.Generator().manual_seed(CALIBRATION_SEED)
        z = torch.randn((1, *spec.latent_shape), generator=noise) / spec.scale_factor
    z = z[:1].float()
    for axis in range(2, z.dim()):
        size = z.shape[axis]
        keep = min(size, DECODER_CALIBRATION_CROP)
        z = z.narrow(axis, (size - keep) // 2, keep)
    return z.contiguous().to(device)


def _apply_decoder_quantization(
    model, autoencoder, config: OptimizationConfig, device, decisions: Decisions, details
) -> Decision:
    """Int8 (or the mixed plan) for the decoder's convolutions, calibrated on a decode of a crop; returns what
    it did."""
    import torch
    from torch import nn

    from engine import quantization as q

    mode = config.decoder_quantization
    ok, why = q.int8_support(device)
    candidates = [
        name
        for name in q.candidate_layers(autoencoder, (nn.Conv3d,))
        if name.startswith("decoder.") or name == "post_quant_conv"
    ]
    latent = decoder_calibration_latent(model, device)
    dtype = _decoder_dtype(config, decisions)

    def decode(ae, autocast: str | None = dtype):
        context = (
            torch.autocast(
                device_type=device.type, dtype=torch.bfloat16 if autocast == "bf16" else torch.float16
            )
            if autocast
            else contextlib.nullcontext()
        )
        with torch.inference_mode(), context:
            return ae.decode(latent).float()

    calibration = q.Calibration()
    handles = calibration.attach(autoencoder, candidates)
    try:
        reference = decode(autoencoder, None)  # fp32: the ranges, and the volume the budget is against
    finally:
        for handle in handles:
            handle.remove()
    crop = "x".join(str(s) for s in latent.shape[2:])
    details.setdefault("decoder", {})["calibration"] = {
        "seed": CALIBRATION_SEED,
        "latent_crop": list(latent.shape[2:]),
        "from": "calibration sampling run" if model.unet is not None else "seeded noise",
        "layers_observed": len(calibration.ranges),
    }
    if mode == "int8":
        done = q.quantize_int8(autoencoder, calibration, candidates)
        volume = decode(autoencoder)
        int8_db = psnr(reference, volume)
        details["decoder"]["int8_psnr_db"] = int8_db
        return Decision(
            mode,
            bool(done),
            f"{len(done)} decoder convolutions in int8 (static quint8 activations, per-channel qint8 weights, "
            f"{why} engine), calibrated on a {crop} latent crop (seed {CALIBRATION_SEED}); {int8_db:.1f} dB vs fp32 "
            "on that decode; GroupNorm and SiLU stay in floating point",
        )
    plan, plan_cached, search_s = calibration_cache.mixed_plan(
        autoencoder,
        {
            "role": "decoder-mixed",
            "budget_db": config.decoder_psnr_budget_db,
            "autocast": dtype,
            "seed": CALIBRATION_SEED,
            "steps": CALIBRATION_STEPS,
            "latent_crop": list(latent.shape[2:]),
            "device": device.type,
            "layers": candidates,
        },
        lambda: q.mixed_precision_plan(
            autoencoder,
            calibration,
            candidates,
            config.decoder_psnr_budget_db,
            decode,
            decode,
            reference_volume=reference,
        ),
    )
    q.quantize_int8(autoencoder, calibration, plan.quantized)
    details["decoder"]["mixed_plan"] = {**plan.record(), "from_cache": plan_cached, "search_s": search_s}
    kept_dtype = dtype or "fp32"
    if not plan.quantized and plan.float_psnr_db < config.decoder_psnr_budget_db:
        return Decision(
            mode,
            False,
            f"the decoded volume is already at {plan.float_psnr_db:.1f} dB vs fp32 with {kept_dtype} alone, below "
            f"the {config.decoder_psnr_budget_db:g} dB budget, and int8 only adds error; lower the budget",
        )
    achieved = "lossless" if math.isinf(plan.achieved_psnr_db) else f"{plan.achieved_psnr_db:.1f} dB"
    return Decision(
        mode,
        bool(plan.quantized),
        f"{len(plan.quantized)} of {len(candidates)} decoder convolutions int8 ({100 * plan.quantized_share:.0f}% of "
        f"the decoder's compute), {len(plan.kept)} kept in {kept_dtype} (chosen by their effect on the decoded "
        f"volume); {achieved} vs fp32 on a {crop} latent crop (budget {config.decoder_psnr_budget_db:g} dB, seed "
        f"{CALIBRATION_SEED})",
    )


class _LatentOut(PreparedModel):
    """A prepared model whose decode hands back the latent itself (a calibration that stops before decoding)."""

    def decode(self, z):
        return z


def _run_calibration(model, unet, device, decode: bool, autocast: str | None = None):
    """Run the engine's sampling loop with ``unet`` (eager; fp32 or under ``autocast``) on the calibration request.

    Returns the final sample: the decoded volume if ``decode`` and the model has a decoder loaded, else the
    final latent (for latent models; a latent-only benchmark loads no decoder).
    """
    from engine.api import SamplingRequest
    from engine.api.relay import drive
    from engine.sampling import denoise

    spec = model.spec
    prepared = _LatentOut if not decode or model.autoencoder is None else PreparedModel
    plain = prepared(
        unet=unet,
        autoencoder=model.autoencoder,
        config=OptimizationConfig(autocast=autocast),
        device=device,
        decisions=Decisions(autocast=Decision(autocast, autocast is not None)),
    )
    request = SamplingRequest(
        model=spec.id,
        steps=min(CALIBRATION_STEPS, int(spec.schedule["num_train_timesteps"])),
        seed=CALIBRATION_SEED,
        guidance_scale=1.0,
    )  # as the bench measures it
    return drive(denoise(plain, spec, request, device)).volumes
