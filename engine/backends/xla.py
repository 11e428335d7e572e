"""Run requests with the networks compiled by XLA: on a TPU VM's chips, or on the host CPU.

The one sampling loop (``engine.sampling.denoise``) is unchanged: the scheduler, the initial noise (the
same CPU generator as every backend, so a seed gives the same volume), classifier-free guidance, previews
and cancel stay on the host in torch. Only the two networks run as XLA programs, the U-Net once per step
and the decoder for previews and the final image. A step moves the latent (the shipped model's is 8x20x24x20
float32, 150 kB per batch item) to the device and back, which is small next to a U-Net step.

Programs are compiled ahead of time for each input shape (``jit(...).lower(...).compile()``), once per model
and shape, and the compile time is recorded in provenance. Precision is explicit: a TPU multiplies
float32 in one bf16 pass by default; this backend asks for ``"highest"`` (full float32) unless told
otherwise, and records what it asked for.
"""

from __future__ import annotations

import contextlib
import platform
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.api import BackendInfo, SamplingRequest
from engine.backends.in_process import InProcessBackend
from engine.backends.provenance import machine_record
from engine.errors import InvalidRequest, OutOfMemory
from engine.machine.software import library_versions
from engine.models.registry import ModelRegistry
from engine.xla import PRECISION_MEANING, PRECISIONS


def jax_versions() -> dict[str, str]:
    import jax
    import jaxlib

    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__}


def xla_devices() -> list[dict[str, Any]]:
    """The XLA devices this process sees, for ``info()`` and the app's server panel."""
    import jax

    devices = []
    # On a host CPU, JAX may hold several fake devices for the planner; jobs run on the first only.
    listed = jax.devices()[:1] if jax.devices()[0].platform == "cpu" else jax.devices()
    for device in listed:
        entry = {"id": int(device.id), "platform": device.platform, "kind": str(device.device_kind)}
        coords = getattr(device, "coords", None)
        if coords is not None:
            entry["coords"] = [int(c) for c in coords]
        devices.append(entry)
    return devices


@dataclass
class XlaModel:
    """A loaded model's networks as compiled XLA programs, called with torch tensors by the sampling loop."""

    unet_arch: Any
    unet_params: Any
    decoder_arch: Any
    decoder_params: Any
    precision: str
    device: Any  # the jax device the programs run on
    report: dict[str, Any] = field(default_factory=dict)  # the optimization report's stand-in
    compile_s: float = 0.0
    _compiled: dict[tuple, Any] = field(default_factory=dict)
    _compile_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_loaded(cls, loaded, precision: str, device) -> XlaModel:
        import jax

        from engine.xla import convert

        def put(module):
            return jax.device_put(convert.numpy_params(module), device)

        autoencoder = loaded.autoencoder
        return cls(
            unet_arch=convert.unet_arch(loaded.unet),
            unet_params=put(loaded.unet),
            decoder_arch=None if autoencoder is None else convert.decoder_arch(autoencoder),
            decoder_params=None if autoencoder is None else put(autoencoder),
            precision=precision,
            device=device,
        )

    def _program(self, name: str, fn, params, *args):
        """The compiled program for these argument shapes: compiled on first use, then reused.

        Weights are an argument, not captured, so they are not folded into the program as constants.
        """
        import jax

        key = (name, *((None if a is None else (tuple(a.shape), str(a.dtype))) for a in args))
        with self._compile_lock:  # one compile per shape, and compile_s summed right, whoever calls
            compiled = self._compiled.get(key)
            if compiled is None:
                started = time.perf_counter()
                compiled = jax.jit(fn).lower(params, *args).compile()
                self.compile_s += time.perf_counter() - started
                self._compiled[key] = compiled
        return compiled

    def _run(self, name: str, fn, params, *tensors):
        """Channels-first torch tensors in, XLA program, channels-first float32 torch tensor out."""
        import jax
        import numpy as np
        import torch

        args = []
        for tensor in tensors:
            if tensor is None:
                args.append(None)
                continue
            array = tensor.detach().float().cpu().numpy()
            if array.ndim == 5:
                array = array.transpose(0, 2, 3, 4, 1)  # NCDHW -> NDHWC
            args.append(jax.device_put(np.ascontiguousarray(array), self.device))
        out = np.asarray(self._program(name, fn, params, *args)(params, *args))
        # A copy: the array XLA hands back is read-only, and torch may write into what it wraps.
        return torch.from_numpy(out.transpose(0, 4, 1, 2, 3).copy())

    def denoiser(self, x, timesteps, context=None):
        from engine.xla.nets import unet_apply

        arch, precision = self.unet_arch, self.precision
        return self._run(
            "unet",
            lambda p, x, t, c: unet_apply(arch, p, x, t, c, precision=precision),
            self.unet_params,
            x,
            timesteps,
            context,
        )

    def _decoder_fn(self):
        from engine.xla.nets import decoder_apply

        arch, precision = self.decoder_arch, self.precision
        return lambda p, z: decoder_apply(arch, p, z, precision=precision)

    def decode(self, z):
        return self._run("decoder", self._decoder_fn(), self.decoder_params, z)

    def compile_decoder(self, latent_shape: tuple[int, ...]) -> None:
        """Compile the decoder for a channels-first latent shape now, so the first decode is not its compile."""
        import jax
        import numpy as np

        b, c, *spatial = latent_shape
        latent = jax.ShapeDtypeStruct((b, *spatial, c), np.float32)
        self._program("decoder", self._decoder_fn(), self.decoder_params, latent)


class XlaBackend(InProcessBackend):
    """Keeps the most recently used model converted and its programs compiled, like the local backend.

    The run itself is :meth:`InProcessBackend.sample`, shared with the local backend; this class fills in
    the XLA parts.
    """

    name = "xla"

    def __init__(
        self,
        registry: ModelRegistry | None = None,
        precision: str = "highest",
        devices: Sequence | None = None,
    ):
        """``devices``: the jax devices this backend may use (a cohort worker's group); None = all of
        ``jax.devices()``. Runs without a plan use the first."""
        if precision not in PRECISIONS:
            raise InvalidRequest(f"unknown XLA precision {precision!r}; use one of {', '.join(PRECISIONS)}")
        from engine.xla.runtime import configure_jax

        # The default: a few fake host devices beside the first, so this process can still plan for GPU
        # boxes (POST /plan); jobs run on the first device only.
        configure_jax()
        import jax

        super().__init__()
        self.registry = registry or ModelRegistry()
        self.precision = precision
        self.devices = list(jax.devices() if devices is None else devices)
        if not self.devices:
            raise InvalidRequest("XlaBackend needs at least one jax device; got an empty device list")
        self.device = self.devices[0]

    def info(self) -> BackendInfo:
        import jax

        from engine.xla.planning import topology_of

        return BackendInfo(
            name=self.name,
            device=f"xla:{self.device.platform}",
            device_name=f"{self.device.device_kind} (XLA)",
            details={
                "platform": platform.platform(),
                **library_versions(),
                **jax_versions(),
                "xla_devices": xla_devices(),
                "xla_topology": topology_of(jax.devices()),
                "xla_precision": self.precision,
                "machine": machine_record(),
            },
        )

    def _build(self, source) -> XlaModel:
        return XlaModel.from_loaded(source.load(), self.precision, self.device)

    def _check(self, run: dict, source, request: SamplingRequest, resolved: SamplingRequest) -> None:
        from engine.api.optimization_config import OptimizationConfig

        if request.optimization != OptimizationConfig():
            raise InvalidRequest(
                "optimization settings (TF32, channels-last, autocast, compile, quantization...) are torch "
                "settings; the xla backend compiles float32 programs with XLA. Clear them, or run on a torch "
                "device (cpu, cuda)."
            )
        if request.xla_plan:
            raise InvalidRequest(
                "this XLA backend runs on one device; multi-device plans are not executed yet"
            )
        if request.kernel_profile_steps:
            raise InvalidRequest(
                "kernel profiles are recorded by torch's profiler; use a torch device for them"
            )

    def _load_message(self, spec) -> str:
        return f"loading {spec.name} for XLA"

    @contextlib.contextmanager
    def _guard(self) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            if "RESOURCE_EXHAUSTED" in str(exc):
                raise OutOfMemory(
                    f"the XLA device ran out of memory ({str(exc).splitlines()[0][:120]}); lower the batch size"
                ) from exc
            raise

    def _prepare(self, run: dict, model, request: SamplingRequest, resolved: SamplingRequest):
        run["model"], run["compile_before"] = model, model.compile_s
        return model

    def _loop_device(self):
        import torch

        return torch.device("cpu")  # where the loop's scheduler and noise live

    def _timings(self, run: dict, load_s: float, loop_timings: dict[str, float]) -> dict[str, float]:
        compile_s = run["model"].compile_s - run["compile_before"]
        return {"load_s": load_s, "compile_s": compile_s, **loop_timings}

    def _described(self) -> dict[str, Any]:
        return {
            "device": f"xla:{self.device.platform}:{self.device.id}",
            "device_name": f"{self.device.device_kind} (XLA)",
            "versions": {**library_versions(), **jax_versions()},
        }

    def _finish(self, run: dict, prepared, provenance: dict[str, Any]) -> None:
        provenance["xla"] = {
            "precision": self.precision,
            "precision_meaning": PRECISION_MEANING[self.precision],
            "platform": self.device.platform,
            "device_kind": str(self.device.device_kind),
            "networks_on_device": ["unet"] + (["decoder"] if prepared.decoder_arch is not None else []),
            "on_host": ["scheduler", "initial noise", "guidance mix"],
        }
