"""Speed and precision settings, and the one place they are applied to a model.

Each setting reports whether it applied on this device and, if not, why; the report goes into the
provenance record and the UI. Combinations that cannot make sense are refused with ``InvalidRequest``
before any work starts (:func:`check_combination`). :func:`expected_report` predicts the report without a
model (the app shows it live), from the same per-setting functions ``prepare`` uses.

``prepare`` never changes the cached fp32 ``LoadedModel``: anything that rewrites modules or weights
(channels-last, SDPA, quantization, compilation) works on a deep copy. Prepared variants are cached per
(model, config, device), because int8 calibration and the mixed-precision search run the sampling loop.
"""

from __future__ import annotations

import contextlib
import copy
import math
import shutil
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any

from engine.api.optimization_config import OptimizationConfig
from engine.errors import InvalidRequest
from engine.machine.probe import probe_machine
from engine.metrics.image import psnr
from engine.optimization import calibration_cache

# Calibration for int8 / mixed: its own seed (not a user's), a few steps spread over the whole schedule.
CALIBRATION_SEED = 20240917
CALIBRATION_STEPS = 4  # module-level so tests can shorten it
# The decoder is calibrated (int8 ranges, the mixed plan's search) on a centre crop of the calibration latent
# at most this many latent voxels per axis: it is fully convolutional, and a full-size decode per trial would
# make the search take hours on a CPU.
DECODER_CALIBRATION_CROP = 8
SUBPIXEL_NOTE = "upsampling as sub-pixel convolutions (8/27 of their multiply-adds)"


ALLOW_SLOWER_ENV = "VOLSYNTH_ALLOW_SLOWER"  # "1": every request of this process carries the override


def check_combination(config: OptimizationConfig, device, *, probe=None, measured=None) -> None:
    """Refuse settings that make no sense on ``device`` (raises ``InvalidRequest`` saying what to change).

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
    slower = slower_here(config, device, probe=probe, measured=measured)
    if slower and not override_requested(config):
        what = "; ".join(f"{_SPEED_NAMES.get(name, name)}: {reason}" for name, reason in slower)
        raise InvalidRequest(
            f"expected slower than fp32 here - {what}. Use fp32 or the setting measured fastest here "
            "(volsynth tune), or run it anyway with --allow-slower (the app: 'Run although slower here')"
        )


def override_requested(config: OptimizationConfig) -> bool:
    import os

    return config.allow_slower or os.environ.get(ALLOW_SLOWER_ENV) == "1"


_SPEED_NAMES = {
    "autocast": "autocast",
    "decoder_autocast": "decoder precision",
    "measured_here": "these settings",
}


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


def speed_entries(config: OptimizationConfig, device, *, probe=None, measured=None) -> dict[str, Any]:
    """Report entries for the speed prediction: ``measured_here`` (what ``volsynth tune`` measured for exactly
    these settings, when it did) and ``allow_slower`` (the override, when asked for)."""
    entries: dict[str, Any] = {}
    row = None
    if measured is not None:
        from engine.optimization import tune_store

        row = tune_store.measured_row(measured, config)
        if row is not None and "error" not in row:
            verdict = row.get("end_to_end_verdict") or {}
            entries["measured_here"] = _entry(
                config.settings.summary(),
                verdict.get("verdict") != "slower",
                f"{verdict.get('words', '')}; PSNR {row.get('psnr_db', float('nan')):.1f} dB vs fp32 "
                f"(volsynth tune, {measured.get('created', '')})",
            )
    slower = slower_here(config, device, probe=probe, measured=measured) if override_requested(config) else []
    if config.allow_slower or slower:  # the process-wide override is recorded where it made a difference
        entries["allow_slower"] = _entry(
            True,
            bool(slower),
            (
                "run although expected slower here: " + "; ".join(reason for _, reason in slower)
                if slower
                else "nothing asked for is expected slower here"
            ),
        )
    return entries


# -- the prepared model ----------------------------------------------------------------------------------


@dataclass
class PreparedModel:
    """A loaded model with an ``OptimizationConfig`` applied, plus the report of what applied.

    ``report`` maps each setting to ``{"requested": ..., "applied": bool, "reason": str}``.
    The sampling loop calls only ``denoiser(x, t, context)``, ``decode(z)`` and ``autocast()``, so new
    settings change this class, never the loop.
    """

    unet: Any
    autoencoder: Any
    config: OptimizationConfig
    device: Any
    report: dict[str, dict[str, Any]]
    unet_call: Any = None  # the callable run per step (compiled / CUDA-graphed U-Net); default: unet
    details: dict[str, Any] = field(default_factory=dict)  # extra facts for benchmarks (mixed plan, ...)

    def _applied(self, name: str) -> bool:
        return bool(self.report.get(name, {}).get("applied"))

    def autocast(self):
        import torch

        if self.config.autocast and self._applied("autocast"):
            dtype = torch.bfloat16 if self.config.autocast == "bf16" else torch.float16
            return torch.autocast(device_type=self.device.type, dtype=dtype)
        return contextlib.nullcontext()

    def precision(self):
        """TF32 on/off for this call only: the flags are process-wide, and other runs may want IEEE fp32."""
        if self.device.type != "cuda":
            return contextlib.nullcontext()
        return _fp32_precision("tf32" if self._applied("tf32") else "ieee")

    def prepare_input(self, x):
        import torch

        if self._applied("channels_last_3d") and x.dim() == 5:
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
        if dtype == "fp32" or not self._applied("decoder_autocast"):
            return torch.autocast(device_type=self.device.type, enabled=False)
        return torch.autocast(
            device_type=self.device.type, dtype=torch.bfloat16 if dtype == "bf16" else torch.float16
        )

    def prepare_decoder_input(self, z):
        import torch

        if (self._applied("decoder_channels_last") or self._applied("channels_last_3d")) and z.dim() == 5:
            return z.contiguous(memory_format=torch.channels_last_3d)
        return z

    def decode(self, z):
        with self.precision(), self.decoder_autocast():
            z = self.prepare_decoder_input(z)
            if self._applied("streamed_decode"):
                from engine.models.streamed_decode import streamed_decode

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
    """Calls the compiled U-Net; if compilation fails at the first call, runs eager and says so in the report."""

    def __init__(self, compiled, eager, report_entry: dict[str, Any]):
        self.compiled, self.eager, self.entry = compiled, eager, report_entry
        self.failed = False

    def __call__(self, x, timesteps, context):
        if not self.failed:
            try:
                return self.compiled(x, timesteps=timesteps, context=context)
            except Exception as exc:  # noqa: BLE001 - any compiler failure means "run eager", reported
                self.failed = True
                self.entry.update(
                    applied=False, reason=f"torch.compile failed, ran eager: {str(exc).splitlines()[0][:200]}"
                )
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
    model, config: OptimizationConfig, device, *, use_cache: bool = True, measured=None
) -> PreparedModel:
    """Apply ``config`` to ``model`` (a LoadedModel already on ``device``).

    Settings that cannot apply here are reported with the reason instead of failing; combinations that
    make no sense raise ``InvalidRequest``, as do settings expected slower here without the override
    (``measured``: the model's tune result on this machine, see ``check_combination``). ``model`` itself is
    never modified.
    """
    check_combination(config, device, measured=measured)
    key = (id(model), config, str(device))
    if use_cache:
        with _cache_lock:
            hit = _cache.get(key)
            if hit is not None and hit[0]() is model:
                cached = hit[1]
                report = copy.deepcopy(cached.report)
                report.pop("measured_here", None)
                report.update(speed_entries(config, device, measured=measured))
                return PreparedModel(
                    unet=cached.unet,
                    autoencoder=cached.autoencoder,
                    config=config,
                    device=device,
                    report=report,
                    unet_call=cached.unet_call,
                    details=cached.details,
                )
    prepared = _prepare(model, config, device)
    prepared.report.update(speed_entries(config, device, measured=measured))
    if use_cache:
        with _cache_lock:
            _cache.clear()  # one prepared variant at a time: 3D U-Nets are large
            _cache[key] = (weakref.ref(model), prepared)
        prepared = PreparedModel(
            unet=prepared.unet,
            autoencoder=prepared.autoencoder,
            config=config,
            device=device,
            report=copy.deepcopy(prepared.report),
            unet_call=prepared.unet_call,
            details=prepared.details,
        )
    return prepared


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()


def _entry(requested, applied: bool, reason: str = "") -> dict[str, Any]:
    return {"requested": requested, "applied": applied, "reason": reason}


def _prepare(model, config: OptimizationConfig, device) -> PreparedModel:
    import torch

    report: dict[str, dict[str, Any]] = {}
    details: dict[str, Any] = {}
    unet, autoencoder = model.unet, model.autoencoder

    # 1. TF32 (a per-call context in PreparedModel.precision; nothing to change in the model).
    probe = probe_machine()
    report["tf32"] = _tf32_entry(config, device, probe)

    # 2. Autocast.
    report["autocast"] = _autocast_entry(config, device, probe)

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
    if autoencoder is not None and (config.channels_last_3d or config.optimizes_decoder):
        autoencoder = copy.deepcopy(autoencoder)

    # 3. SDPA attention: flip MONAI's use_flash_attention on every attention block (same weights).
    report["attention"] = _attention_entry(
        config, _use_sdpa(unet) if config.attention == "sdpa" and unet is not None else 0
    )

    # 4. Sub-pixel upsampling and quantization (before channels-last and compile: they replace modules).
    # int8 calibration and the mixed plan are measured on the plain U-Net (their caches are shared with
    # the rows without sub-pixel upsampling); the rewrite keeps the layer names, so they apply after it.
    def sub_pixel() -> None:
        if config.unet_subpixel and unet is not None:
            from engine.optimization.unet_subpixel import subpixel_rewrite_unet

            rewritten = subpixel_rewrite_unet(unet)
            report["unet_subpixel"] = _unet_subpixel_entry(config, len(rewritten))
            details["unet_subpixel_blocks"] = rewritten

    report["unet_subpixel"] = _unet_subpixel_entry(config, 0 if unet is None else None)
    report["quantization"] = _entry(config.quantization, False)
    int8_path = config.quantization in ("int8", "mixed") and _quantization_support(config, device)[0]
    if config.quantization and unet is not None:
        _apply_quantization(
            model, unet, config, device, report, details, before_int8=sub_pixel if int8_path else None
        )
    if not int8_path:
        sub_pixel()

    # 5. Channels-last 3D: weights now, inputs per call (PreparedModel.prepare_input).
    report["channels_last_3d"] = _channels_last_entry(config, device)
    if config.channels_last_3d:
        if unet is not None:
            unet.to(memory_format=torch.channels_last_3d)
        if autoencoder is not None:
            autoencoder.to(memory_format=torch.channels_last_3d)

    # 6. Compile / CUDA graphs: wrap the call, not the module, so PreparedModel.unet stays inspectable.
    unet_call = None
    report["compile_mode"] = _compile_entry(config, device)
    if report["compile_mode"]["applied"]:
        compiled = torch.compile(unet, mode=config.compile_mode, dynamic=False)
        unet_call = _CompiledWithFallback(compiled, unet, report["compile_mode"])
    report["cuda_graphs"] = _cuda_graphs_entry(config)
    if config.cuda_graphs:  # check_combination refused it off CUDA
        base = unet_call or (lambda x, timesteps, context: unet(x, timesteps=timesteps, context=context))
        unet_call = _CudaGraphed(base)

    # 6b. Step caching: the per-step call reuses the deep levels' features between full passes (after the
    # module rewrites above, which it calls through; check_combination keeps it apart from compile/graphs).
    report["step_cache"] = _step_cache_entry(config, None)
    if config.step_caching and unet is not None:
        unet_call, report["step_cache"] = _step_cached_call(unet, config)

    # 7. Streamed decode.
    report["streamed_decode"] = _streamed_decode_entry(config, has_decoder=autoencoder is not None)

    # 8. The decoder's own settings, on the decoder's copy: sub-pixel upsampling, then quantization (it
    # replaces modules, including the sub-pixel ones), then channels-last.
    has_decoder = autoencoder is not None
    report["decoder_autocast"] = _decoder_autocast_entry(config, device, has_decoder, probe)
    report["decoder_quantization"] = _expected_decoder_quantization_entry(config, device, has_decoder)
    report["decoder_channels_last"] = _decoder_channels_last_entry(config, device, has_decoder)
    if has_decoder and config.optimizes_decoder:
        from engine.models.streamed_decode import subpixel_rewrite

        details["decoder"] = {"subpixel_upsampling_blocks": subpixel_rewrite(autoencoder)}
        if report["decoder_quantization"]["applied"]:
            _apply_decoder_quantization(model, autoencoder, config, device, report, details)
        if report["decoder_channels_last"]["applied"]:
            autoencoder.to(memory_format=torch.channels_last_3d)

    mark_slower(report, config, device)
    return PreparedModel(
        unet=unet,
        autoencoder=autoencoder,
        config=config,
        device=device,
        report=report,
        unet_call=unet_call,
        details=details,
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
    check_combination(config, device, probe=probe, measured=measured)
    has_decoder = spec is None or spec.kind != "pixel"
    report = {
        "tf32": _tf32_entry(config, device, probe),
        "autocast": _autocast_entry(config, device, probe),
        "attention": _attention_entry(config, None),
        "unet_subpixel": _unet_subpixel_entry(config, None),
        "quantization": _expected_quantization_entry(config, device),
        "channels_last_3d": _channels_last_entry(config, device),
        "compile_mode": _compile_entry(config, device),
        "cuda_graphs": _cuda_graphs_entry(config),
        "step_cache": _step_cache_entry(config, None),
        "streamed_decode": _streamed_decode_entry(config, has_decoder=has_decoder),
        "decoder_autocast": _decoder_autocast_entry(config, device, has_decoder, probe),
        "decoder_quantization": _expected_decoder_quantization_entry(config, device, has_decoder),
        "decoder_channels_last": _decoder_channels_last_entry(config, device, has_decoder),
    }
    mark_slower(report, config, device, probe=probe, measured=measured)
    report.update(speed_entries(config, device, probe=probe, measured=measured))
    return report


def mark_slower(report: dict[str, dict[str, Any]], config, device, *, probe=None, measured=None) -> None:
    """Add ``expected_slower`` (the reason) to the entries of settings expected slower than fp32 here."""
    for name, reason in slower_here(config, device, probe=probe, measured=measured):
        if name in report:
            report[name]["expected_slower"] = reason


# -- what applies where: one function per setting, shared by _prepare and expected_report ----------------


def _gpu_capability(device, probe) -> tuple[int, int]:
    gpu = probe.gpu(device.index)
    if gpu is not None:
        return gpu.compute_capability
    import torch

    return torch.cuda.get_device_capability(device)


def _tf32_entry(config: OptimizationConfig, device, probe) -> dict[str, Any]:
    is_cuda = device.type == "cuda"
    if not config.tf32:
        return _entry(False, False, "fp32 convolutions and matmuls forced to IEEE fp32" if is_cuda else "")
    if is_cuda:
        capability = _gpu_capability(device, probe)
        if capability >= (8, 0):
            return _entry(
                True,
                True,
                f"convolutions and matmuls in TF32 (compute capability {capability[0]}.{capability[1]})",
            )
        where = f"this GPU is {capability[0]}.{capability[1]}"
    else:
        where = f"this run is on {device.type}"
    return _entry(True, False, f"TF32 needs an NVIDIA GPU of compute capability 8.0+; {where}")


def _autocast_entry(config: OptimizationConfig, device, probe) -> dict[str, Any]:
    if not config.autocast:
        return _entry(None, False)
    ok, reason = _autocast_support(config.autocast, device, probe)
    return _entry(config.autocast, ok, reason)


def _attention_entry(config: OptimizationConfig, switched: int | None) -> dict[str, Any]:
    """``switched``: how many attention blocks now use SDPA, or None when predicting without the model."""
    if config.attention != "sdpa":
        return _entry("default", False)
    if switched == 0:
        return _entry("sdpa", False, "the model has no attention blocks that can use SDPA")
    count = "the model's" if switched is None else str(switched)
    return _entry(
        "sdpa", True, f"{count} attention block(s) use torch.nn.functional.scaled_dot_product_attention"
    )


def _unet_subpixel_entry(config: OptimizationConfig, rewritten: int | None) -> dict[str, Any]:
    """``rewritten``: how many upsampling blocks became sub-pixel, or None when predicting without them."""
    if not config.unet_subpixel:
        return _entry(False, False)
    if rewritten == 0:
        return _entry(True, False, "the U-Net has no nearest-x2 + 3x3x3 upsampling convolution")
    count = "the U-Net's" if rewritten is None else str(rewritten)
    return _entry(
        True,
        True,
        f"{count} upsampling block(s) as sub-pixel convolutions at the low resolution (nearest x2 + 3x3x3 "
        "= eight 2x2x2 convolutions: the same result up to float rounding, about a third of their "
        "multiply-adds)",
    )


def _quantization_support(config: OptimizationConfig, device) -> tuple[bool, str]:
    """Whether ``config.quantization`` has kernels on ``device``: (True, int8 engine or fp8 note) or (False, why)."""
    from engine import quantization as q

    return q.fp8_support(device) if config.quantization == "fp8" else q.int8_support(device)


def _expected_quantization_entry(config: OptimizationConfig, device) -> dict[str, Any]:
    mode = config.quantization
    if not mode:
        return _entry(None, False)
    ok, why = _quantization_support(config, device)
    if not ok:
        return _entry(mode, False, why)
    if mode == "fp8":
        plan = "Linear layers with fp8-compatible shapes in fp8 e4m3; convolutions keep their precision"
    elif mode == "int8":
        plan = f"U-Net Conv3d and Linear layers in int8 ({why} engine), calibrated when the model is prepared"
    else:
        plan = (
            f"int8 except the layers needed to keep the volume within {config.psnr_budget_db:g} dB of fp32, "
            "found by a calibration search when the model is prepared (slow the first time)"
        )
    return _entry(mode, True, plan)


def _channels_last_entry(config: OptimizationConfig, device) -> dict[str, Any]:
    if not config.channels_last_3d:
        return _entry(False, False)
    kept = _conv_keeps_channels_last(device)
    return _entry(
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


def _compile_entry(config: OptimizationConfig, device) -> dict[str, Any]:
    if not config.compile_mode:
        return _entry(None, False)
    ok, why = _compile_support(device)
    if not ok:
        return _entry(config.compile_mode, False, why)
    return _entry(
        config.compile_mode,
        True,
        f"torch.compile(mode={config.compile_mode!r})"
        + ("; no CUDA graphs off CUDA" if config.compile_mode != "default" and device.type != "cuda" else ""),
    )


def _cuda_graphs_entry(config: OptimizationConfig) -> dict[str, Any]:
    if not config.cuda_graphs:  # when requested, check_combination has already refused it off CUDA
        return _entry(False, False)
    return _entry(True, True, "U-Net captured once per input shape, replayed each step")


def _step_cache_entry(config: OptimizationConfig, levels: int | None) -> dict[str, Any]:
    """``levels``: the U-Net's number of levels, or None when predicting without the model."""
    if not config.step_caching:
        return _entry(None, False)
    k, level = config.step_cache_interval, config.step_cache_level
    requested = f"every {k} steps, level {level}"
    if levels == 0:
        return _entry(
            requested, False, "the denoiser is not a MONAI diffusion U-Net, which step caching needs"
        )
    return _entry(
        requested,
        True,
        f"a full U-Net pass every {k} steps (the first of a run included); the steps between recompute the top "
        f"{level} level(s) and reuse the deeper features of the last full pass (DeepCache-style; not exact: "
        "its quality cost is measured against the uncached run by volsynth tune)",
    )


def _step_cached_call(unet, config: OptimizationConfig):
    """(the step-cached per-step callable or None, its report entry); refuses a level the U-Net lacks."""
    from engine.optimization.step_cache import StepCachedUNet, unet_levels

    levels = unet_levels(unet)
    if levels is None:
        return None, _step_cache_entry(config, 0)
    if config.step_cache_level > levels:
        raise InvalidRequest(
            f"step cache level {config.step_cache_level} is deeper than this U-Net's {levels} levels; "
            f"choose a level from 1 to {levels}"
        )
    return StepCachedUNet(unet, config.step_cache_interval, config.step_cache_level), _step_cache_entry(
        config, levels
    )


def _streamed_decode_entry(config: OptimizationConfig, has_decoder: bool) -> dict[str, Any]:
    if not config.streamed_decode:
        return _entry(False, False)
    if not has_decoder:
        return _entry(True, False, "pixel-space model: there is no decoder to stream")
    return _entry(
        True,
        True,
        "exact decode layer by layer in slabs (engine/models/streamed_decode.py): same result, at "
        "most two full-resolution activations",
    )


_NO_DECODER = "pixel-space model: there is no decoder"


def _decoder_autocast_entry(config: OptimizationConfig, device, has_decoder: bool, probe) -> dict[str, Any]:
    dtype = config.decoder_autocast
    if dtype is None:
        return _entry(None, False)
    if not has_decoder:
        return _entry(dtype, False, _NO_DECODER)
    if dtype == "fp32":
        return _entry(dtype, True, f"the decoder in fp32 whatever the U-Net runs in; {SUBPIXEL_NOTE}")
    ok, reason = _autocast_support(dtype, device, probe)
    return _entry(dtype, ok, f"{reason} for the decoder; {SUBPIXEL_NOTE}" if ok else reason)


def _expected_decoder_quantization_entry(
    config: OptimizationConfig, device, has_decoder: bool
) -> dict[str, Any]:
    """What decoder quantization will do here; ``_apply_decoder_quantization`` replaces the reason."""
    from engine import quantization as q

    mode = config.decoder_quantization
    if not mode:
        return _entry(None, False)
    if not has_decoder:
        return _entry(mode, False, _NO_DECODER)
    ok, why = q.int8_support(device)
    if not ok:
        return _entry(mode, False, why)
    if mode == "int8":
        plan = f"every decoder convolution in int8 ({why} engine), calibrated when the model is prepared"
    else:
        plan = (
            f"decoder convolutions in int8 except those needed to keep the decoded volume within "
            f"{config.decoder_psnr_budget_db:g} dB of fp32, found by a search on a calibration decode when the "
            "model is prepared"
        )
    return _entry(mode, True, plan)


def _decoder_channels_last_entry(config: OptimizationConfig, device, has_decoder: bool) -> dict[str, Any]:
    if not config.decoder_channels_last:
        return _entry(False, False)
    if not has_decoder:
        return _entry(True, False, _NO_DECODER)
    if device.type != "cpu":
        return _entry(
            True,
            True,
            f"decoder weights and activations in NDHWC on {device.type} (measured faster only with oneDNN on "
            "x86 CPUs so far)",
        )
    return _entry(
        True,
        True,
        "decoder weights and activations in NDHWC: oneDNN's fp32, bf16 and int8 convolutions run faster "
        "on it on x86 CPUs (the streamed decode stores its activations NDHWC)",
    )


def _autocast_support(dtype: str, device, probe) -> tuple[bool, str]:
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


def _conv_keeps_channels_last(device) -> bool:
    """Whether this build's Conv3d returns channels-last output for channels-last input on ``device``."""
    import torch

    key = device.type
    if key not in _CL_PROBE:
        conv = torch.nn.Conv3d(8, 8, 3, padding=1).to(device).to(memory_format=torch.channels_last_3d)
        x = torch.zeros(1, 8, 4, 4, 4, device=device).contiguous(memory_format=torch.channels_last_3d)
        with torch.inference_mode():
            _CL_PROBE[key] = conv(x).is_contiguous(memory_format=torch.channels_last_3d)
    return _CL_PROBE[key]


# -- quantization ----------------------------------------------------------------------------------------


def _apply_quantization(
    model, unet, config: OptimizationConfig, device, report, details, before_int8=None
) -> None:
    """int8, fp8 or the mixed plan for the U-Net, in place. ``before_int8`` (if given) runs after the
    calibration and the plan were measured on the plain U-Net and before its layers are replaced."""
    from engine import quantization as q

    mode = config.quantization
    ok, why = _quantization_support(config, device)  # the same check expected_report makes
    if not ok:
        report["quantization"] = _entry(mode, False, why)
        return
    if mode == "fp8":
        names = q.quantize_fp8(unet)
        report["quantization"] = _entry(
            mode,
            bool(names),
            (
                f"{len(names)} Linear layer(s) in fp8 e4m3 (torch._scaled_mm); PyTorch has no fp8 Conv3d, so "
                "convolutions keep their precision"
                if names
                else "no Linear layer has fp8-compatible shapes"
            ),
        )
        return

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
        report["quantization"] = _entry(
            mode,
            bool(done),
            (
                f"{convs} Conv3d (static quint8 activations, per-channel qint8 weights) and {len(done) - convs} Linear "
                f"(dynamic int8) layer(s) of the U-Net, {why} engine; calibrated on {CALIBRATION_STEPS} steps of seed "
                f"{CALIBRATION_SEED}{' (ranges from the calibration cache)' if cached else ''}; GroupNorm, "
                "activations, attention and the decoder stay in floating point"
            ),
        )
        return

    _apply_mixed(model, unet, config, device, report, details, calibration, candidates, before_int8)


def _apply_mixed(
    model, unet, config: OptimizationConfig, device, report, details, calibration, candidates, before_int8
) -> None:
    """The mixed plan: a sensitivity-ranked search for the fewest float layers that meet the PSNR budget.
    Trials run in the precision the prepared model will run in (kept layers run under autocast too); the
    budget is against the fp32 volume."""
    from engine import quantization as q

    mode = config.quantization
    autocast = config.autocast if report["autocast"]["applied"] else None

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
        report["quantization"] = _entry(
            mode,
            False,
            (
                f"the {judged_on} is already at {plan.float_psnr_db:.1f} dB vs fp32 with {autocast} autocast alone, "
                f"below the {config.psnr_budget_db:g} dB budget, and int8 only adds error; lower the budget or turn "
                "autocast off"
            ),
        )
        return
    achieved = "lossless" if math.isinf(plan.achieved_psnr_db) else f"{plan.achieved_psnr_db:.1f} dB"
    kept_dtype = autocast or "fp32"
    report["quantization"] = _entry(
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


def _decoder_dtype(config: OptimizationConfig, report) -> str | None:
    """The autocast dtype the prepared decoder runs in (None: fp32)."""
    if config.decoder_autocast is None:
        return config.autocast if report["autocast"]["applied"] else None
    if config.decoder_autocast == "fp32" or not report["decoder_autocast"]["applied"]:
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
    model, autoencoder, config: OptimizationConfig, device, report, details
) -> None:
    """Int8 (or the mixed plan) for the decoder's convolutions, calibrated on a decode of a crop."""
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
    dtype = _decoder_dtype(config, report)

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
        report["decoder_quantization"] = _entry(
            mode,
            bool(done),
            f"{len(done)} decoder convolutions in int8 (static quint8 activations, per-channel qint8 weights, "
            f"{why} engine), calibrated on a {crop} latent crop (seed {CALIBRATION_SEED}); {int8_db:.1f} dB vs fp32 "
            "on that decode; GroupNorm and SiLU stay in floating point",
        )
        return
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
        report["decoder_quantization"] = _entry(
            mode,
            False,
            f"the decoded volume is already at {plan.float_psnr_db:.1f} dB vs fp32 with {kept_dtype} alone, below "
            f"the {config.decoder_psnr_budget_db:g} dB budget, and int8 only adds error; lower the budget",
        )
        return
    achieved = "lossless" if math.isinf(plan.achieved_psnr_db) else f"{plan.achieved_psnr_db:.1f} dB"
    report["decoder_quantization"] = _entry(
        mode,
        bool(plan.quantized),
        f"{len(plan.quantized)} of {len(candidates)} decoder convolutions int8 ({100 * plan.quantized_share:.0f}% of "
        f"the decoder's compute), {len(plan.kept)} kept in {kept_dtype} (chosen by their effect on the decoded "
        f"volume); {achieved} vs fp32 on a {crop} latent crop (budget {config.decoder_psnr_budget_db:g} dB, seed "
        f"{CALIBRATION_SEED})",
    )


def _run_calibration(model, unet, device, decode: bool, autocast: str | None = None):
    """Run the engine's sampling loop with ``unet`` (eager; fp32 or under ``autocast``) on the calibration request.

    Returns the final sample: the decoded volume if ``decode`` and the model has a decoder loaded, else the
    final latent (for latent models; a latent-only benchmark loads no decoder).
    """
    from engine.api import SamplingRequest, run
    from engine.sampling import denoise

    spec = model.spec
    plain = PreparedModel(
        unet=unet,
        autoencoder=model.autoencoder,
        config=OptimizationConfig(autocast=autocast),
        device=device,
        report={"autocast": {"applied": autocast is not None}},
    )
    if not decode or model.autoencoder is None:
        plain.decode = lambda z: z  # the latent itself
    request = SamplingRequest(
        model=spec.id,
        steps=min(CALIBRATION_STEPS, int(spec.schedule["num_train_timesteps"])),
        seed=CALIBRATION_SEED,
        guidance_scale=1.0,
    )  # as the bench measures it
    return run(denoise(plain, spec, request, device)).volumes
