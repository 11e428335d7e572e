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

import numpy as np

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


def xla_devices(devices: Sequence | None = None) -> list[dict[str, Any]]:
    """The XLA devices a backend uses (default: all this process sees), for ``info()`` and the app's
    server panel; fake host CPU devices are marked as stand-ins."""
    import jax

    out = []
    for device in jax.devices() if devices is None else devices:
        entry = {"id": int(device.id), "platform": device.platform, "kind": str(device.device_kind)}
        coords = getattr(device, "coords", None)
        if coords is not None:
            entry["coords"] = [int(c) for c in coords]
        if device.platform == "cpu":
            entry["host_stand_in"] = True
        out.append(entry)
    return out


def first_devices(count: int) -> list:
    """The first ``count`` jax devices; on a host CPU, JAX is set up with that many fake devices first
    (which only works before JAX starts in this process)."""
    if count < 1:
        raise InvalidRequest(f"--xla-devices must be at least 1, got {count}")
    from engine.xla.runtime import configure_jax

    configure_jax(max(8, count))
    import jax

    devices = jax.devices()
    if len(devices) < count:
        raise InvalidRequest(
            f"--xla-devices {count}: this process has {len(devices)} {devices[0].platform} device(s)"
        )
    return list(devices[:count])


def _guidance_of(resolved: SamplingRequest) -> float:
    """The guidance scale of a request that ``resolve_request`` filled in. A request still holding None
    (the model's default) has not been resolved: a plan's batch cannot be known from it."""
    if resolved.guidance_scale is None:
        raise ValueError("the request's guidance scale is unresolved: pass it through resolve_request first")
    return resolved.guidance_scale


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
    # ("unet" | "decoder", ...) -> the ShardedUNet / SplitDecoder of the most recent plan (one of each kind:
    # each holds its own replicated copy of the weights on its devices).
    _sharded: dict[tuple, Any] = field(default_factory=dict)

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

    @staticmethod
    def _host_arrays(tensors) -> list[np.ndarray | None]:
        """Channels-first torch tensors -> contiguous channels-last float32 numpy arrays (None stays None)."""
        arrays: list[np.ndarray | None] = []
        for tensor in tensors:
            if tensor is None:
                arrays.append(None)
                continue
            array = tensor.detach().float().cpu().numpy()
            if array.ndim == 5:
                array = array.transpose(0, 2, 3, 4, 1)  # NCDHW -> NDHWC
            arrays.append(np.ascontiguousarray(array))
        return arrays

    @staticmethod
    def _channels_first(out):
        import torch

        # A copy: the array XLA hands back is read-only, and torch may write into what it wraps.
        return torch.from_numpy(out.transpose(0, 4, 1, 2, 3).copy())

    def _run(self, name: str, fn, params, *tensors):
        """Channels-first torch tensors in, XLA program, channels-first float32 torch tensor out."""
        import jax

        args = [None if a is None else jax.device_put(a, self.device) for a in self._host_arrays(tensors)]
        return self._channels_first(np.asarray(self._program(name, fn, params, *args)(params, *args)))

    def sharded_unet(self, resolved, devices: Sequence, spatial, batch: int, cfg: bool):
        """The U-Net compiled for ``resolved``'s plan over ``devices`` (all the server's, by index), weights
        replicated on its mesh; built once per plan, placement and device group."""
        from engine.xla.execution import ShardedUNet, run_network

        mesh_devices = [devices[i] for i in resolved.order[: resolved.n_devices]]
        key = ("unet", resolved.plan, tuple(int(d.id) for d in mesh_devices))
        with self._compile_lock:
            unet = self._sharded.get(key)
            if unet is None:
                network = run_network(
                    self.unet_arch, self.unet_params, spatial, batch, cfg, self.precision, "unet"
                )
                self._evict("unet")
                unet = ShardedUNet.build(network, resolved.plan, mesh_devices, self.unet_params)
                self._sharded[key] = unet
        return unet

    def _evict(self, kind: str) -> None:
        """Drop the sharded programs (and their weight copies) of ``kind``, keeping their compile time."""
        for key in [k for k in self._sharded if k[0] == kind]:
            self.compile_s += self._sharded.pop(key).compile_s

    def sharded_denoiser(self, unet, x, timesteps, context=None):
        """The loop's denoiser call, run by a sharded U-Net program."""
        return self._channels_first(unet(*self._host_arrays((x, timesteps, context))))

    def split_decode(self, decoder, z):
        """The loop's decode call, run by the decoder split over a plan's devices."""
        return self._channels_first(decoder(self._host_arrays((z,))[0]))

    def split_decoder(self, devices: Sequence, latent_shape) -> tuple[Any, str]:
        """The decoder split over ``devices`` (a plan's) for a channels-last latent shape, built once per
        device group and shape; ``(None, why)`` when the latent does not split over them."""
        from engine.xla.execution import SplitDecoder

        if self.decoder_arch is None:
            return None, "the model has no decoder"
        key = ("decoder", tuple(int(d.id) for d in devices), tuple(latent_shape))
        with self._compile_lock:
            decoder = self._sharded.get(key)
            if decoder is None:
                self._evict("decoder")
                try:
                    decoder = SplitDecoder.build(
                        self.decoder_arch, self.decoder_params, devices, self.precision, latent_shape
                    )
                except InvalidRequest as exc:
                    return None, f"one device (the first): {exc}"
                self._sharded[key] = decoder
        return decoder, ""

    def compile_total_s(self) -> float:
        """Seconds spent compiling, one-device and sharded programs together."""
        return self.compile_s + sum(u.compile_s for u in self._sharded.values())

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

        b, c, *spatial = latent_shape
        latent = jax.ShapeDtypeStruct((b, *spatial, c), np.float32)
        self._program("decoder", self._decoder_fn(), self.decoder_params, latent)


@dataclass
class PlannedRun:
    """What the loop runs under a plan: the loaded model with its U-Net sharded as ``resolved`` says.

    The one sampling loop calls ``denoiser`` and ``decode`` as on any prepared model."""

    model: XlaModel
    unet: Any  # engine.xla.execution.ShardedUNet
    resolved: Any  # engine.xla.execution.ResolvedPlan
    decoder: Any = None  # engine.xla.execution.SplitDecoder over the U-Net's devices, or None: one device
    decoder_note: str = ""  # why the decoder runs on one device, when it does

    @property
    def decoder_arch(self):
        return self.model.decoder_arch

    def denoiser(self, x, timesteps, context=None):
        return self.model.sharded_denoiser(self.unet, x, timesteps, context)

    def decode(self, z):
        if self.decoder is None:
            return self.model.decode(z)
        return self.model.split_decode(self.decoder, z)


class XlaBackend(InProcessBackend):
    """Keeps the most recently used model converted and its programs compiled, like the local backend.

    The run itself is :meth:`InProcessBackend.sample`, shared with the local backend; this class fills in
    the XLA parts. A request's ``xla_plan`` shards the U-Net over ``devices`` (see ``engine.xla.execution``);
    without one the networks run on the first device.
    """

    name = "xla"
    plan_compile_top = 3  # plans "best" compiles by estimate for the topology (the planner's default)

    def __init__(
        self,
        registry: ModelRegistry | None = None,
        precision: str = "highest",
        devices: Sequence | None = None,
        topology: str | None = None,
    ):
        """``devices``: the jax devices this backend may use (a cohort worker's group); None = all of
        ``jax.devices()``. ``topology``: the slice or box plans are costed against (``v5e:2x4``); None =
        the TPU slice the devices form, if they form one. On host CPU devices a topology names what they
        stand in for."""
        if precision not in PRECISIONS:
            raise InvalidRequest(f"unknown XLA precision {precision!r}; use one of {', '.join(PRECISIONS)}")
        from engine.xla.runtime import configure_jax

        # The default: a few fake host devices beside the first, so this process can still plan for GPU
        # boxes (POST /plan) and run plans over host stand-ins.
        configure_jax()
        import jax

        super().__init__()
        self.registry = registry or ModelRegistry()
        self.precision = precision
        self.devices = list(jax.devices() if devices is None else devices)
        if not self.devices:
            raise InvalidRequest("XlaBackend needs at least one jax device; got an empty device list")
        self.device = self.devices[0]
        self.topology = self._topology(topology)
        self._plans: dict[tuple, Any] = {}  # (model, latent shape, batch, cfg, plan) -> ResolvedPlan
        self._plans_lock = threading.Lock()

    def _topology(self, name: str | None):
        """The topology asked for (refused when it is unknown or not this backend's size), else the TPU
        slice the devices form, when they form a whole one (a cohort worker's sub-group may not: None)."""
        from engine.xla.planning import topology_of
        from engine.xla.topology import UnknownTopology, parse_topology

        if not name:
            detected = topology_of(self.devices)
            try:
                topology = parse_topology(detected) if detected else None
            except UnknownTopology:
                return None
            return topology if topology is not None and topology.n_devices == len(self.devices) else None
        try:
            topology = parse_topology(name)
        except UnknownTopology as exc:
            raise InvalidRequest(str(exc)) from None
        if topology.n_devices != len(self.devices):
            raise InvalidRequest(
                f"topology {topology.name} has {topology.n_devices} devices, this backend has "
                f"{len(self.devices)}; give a topology of its size (or --xla-devices {topology.n_devices})"
            )
        return topology

    @property
    def host_stand_ins(self) -> bool:
        """Whether the devices are fake host CPU devices standing in for a slice or box."""
        return self.device.platform == "cpu"

    def _physical(self) -> list:
        """The backend's devices by the topology's physical index (TPU: by coordinates; host stand-ins:
        in order)."""
        if self.topology is None or self.host_stand_ins:
            return list(self.devices)
        by_index = {}
        for device in self.devices:
            coords = getattr(device, "coords", None)
            if coords is None:
                return list(self.devices)
            by_index[self.topology.index(tuple(coords)[: len(self.topology.shape)])] = device
        return (
            [by_index[i] for i in range(len(self.devices))]
            if len(by_index) == len(self.devices)
            else list(self.devices)
        )

    def plan_names(self) -> list[str]:
        from engine.xla.execution import mesh_names

        return mesh_names(len(self.devices)) if len(self.devices) > 1 else []

    def info(self) -> BackendInfo:
        topology = self.topology.name if self.topology else None
        return BackendInfo(
            name=self.name,
            device=f"xla:{self.device.platform}",
            device_name=f"{self.device.device_kind} (XLA)",
            details={
                "platform": platform.platform(),
                **library_versions(),
                **jax_versions(),
                "xla_devices": xla_devices(self.devices),
                "xla_device_count": len(self.devices),
                "xla_topology": topology,
                "xla_host_stand_ins": self.host_stand_ins,
                # Mesh names; a model adds "/cut@K" variants (stop sharding from level K) and may refuse a mesh
                # its batch or extents cannot split. "best" needs a topology.
                "xla_plans": (["best"] if topology and len(self.devices) > 1 else []) + self.plan_names(),
                "xla_precision": self.precision,
                "machine": machine_record(),
            },
        )

    def _build(self, source) -> XlaModel:
        return XlaModel.from_loaded(source.load(), self.precision, self.device)

    def _check(self, run: dict, source, request: SamplingRequest, resolved: SamplingRequest) -> None:
        from engine.api.optimization_config import OptimizationConfig
        from engine.xla.execution import check_batch, mesh_of_name

        if request.optimization != OptimizationConfig():
            raise InvalidRequest(
                "optimization settings (TF32, channels-last, autocast, compile, quantization...) are torch "
                "settings; the xla backend compiles float32 programs with XLA. Clear them, or run on a torch "
                "device (cpu, cuda)."
            )
        run["source"] = source
        if request.xla_plan:
            if len(self.devices) == 1:
                raise InvalidRequest(
                    f"xla_plan {request.xla_plan!r} splits a run over several devices; this XLA backend has one. "
                    "Clear the plan, or start the server with more (volsynth serve --device xla --xla-devices N)"
                )
            if request.xla_plan != "best":
                needed = int(np.prod(mesh_of_name(request.xla_plan)))
                if needed > len(self.devices):
                    raise InvalidRequest(
                        f"plan {request.xla_plan} needs {needed} devices; this server has {len(self.devices)}"
                    )
            check_batch(request.xla_plan, resolved.batch_size, _guidance_of(resolved))
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

    @staticmethod
    def _plan_shape(source, resolved: SamplingRequest):
        """(latent channels, latent spatial shape, the U-Net's batch, CFG) of a request's run."""
        from engine.xla.execution import effective_batch

        channels, *spatial = tuple(source.spec.latent_shape_for(resolved.output_size))
        guidance = _guidance_of(resolved)
        batch = effective_batch(resolved.batch_size, guidance)
        return channels, tuple(spatial), batch, guidance != 1.0

    def _prepare_message(self, run: dict, resolved: SamplingRequest) -> str:
        if not resolved.xla_plan:
            return ""
        source = run["source"]
        _channels, spatial, batch, cfg = self._plan_shape(source, resolved)
        where = f"{len(self.devices)} XLA devices" + (f" ({self.topology.name})" if self.topology else "")
        if resolved.xla_plan == "best" and (str(source.path), spatial, batch, cfg, "best") not in self._plans:
            from engine.xla.planner import DEFAULT_TIME_LIMIT_S

            return (
                f"planning the best split of {source.spec.name} over {where}: at most "
                f"{DEFAULT_TIME_LIMIT_S:.0f} s, once per model and shape; then compiling it"
            )
        return f"compiling {source.spec.name} for plan {resolved.xla_plan} on {where}"

    def _resolved_plan(self, source, model: XlaModel, resolved: SamplingRequest):
        """The request's plan for this run, resolved once per (model, latent shape, batch, CFG, plan)."""
        from engine.xla.execution import resolve_plan, run_network

        channels, spatial, batch, cfg = self._plan_shape(source, resolved)
        key = (str(source.path), spatial, batch, cfg, resolved.xla_plan)
        with self._plans_lock:
            plan = self._plans.get(key)
            if plan is None:
                network = run_network(
                    model.unet_arch, model.unet_params, spatial, batch, cfg, self.precision, source.spec.id
                )
                plan = resolve_plan(
                    resolved.xla_plan, network, len(self.devices), self.topology, self.plan_compile_top
                )
                self._plans[key] = plan
        return plan, channels, spatial, batch, cfg

    def _prepare(self, run: dict, model, request: SamplingRequest, resolved: SamplingRequest):
        run["model"], run["compile_before"] = model, model.compile_total_s()
        if not resolved.xla_plan:
            return model
        plan, channels, spatial, batch, cfg = self._resolved_plan(run["source"], model, resolved)
        unet = model.sharded_unet(plan, self._physical(), spatial, batch, cfg)
        # Compiled here, before the loop: its step times are steps (they are set beside the prediction).
        unet.compile_for(batch)
        if run["source"].spec.kind != "latent":
            return PlannedRun(model, unet, plan, None, "no decoder: the model makes images directly")
        # The decoder is split over the U-Net's devices; it decodes the loop's latent (batch B, not 2B).
        latent = (resolved.batch_size, *spatial, channels)
        decoder, note = model.split_decoder(unet.devices, latent)
        if decoder is not None:
            decoder.compile_for(latent)
        return PlannedRun(model, unet, plan, decoder, note)

    def _loop_device(self):
        import torch

        return torch.device("cpu")  # where the loop's scheduler and noise live

    def _timings(self, run: dict, load_s: float, loop_timings: dict[str, float]) -> dict[str, float]:
        compile_s = run["model"].compile_total_s() - run["compile_before"]
        return {"load_s": load_s, "compile_s": compile_s, **loop_timings}

    def _described(self) -> dict[str, Any]:
        return {
            "device": f"xla:{self.device.platform}:{self.device.id}",
            "device_name": f"{self.device.device_kind} (XLA)",
            "versions": {**library_versions(), **jax_versions()},
        }

    def _finish(self, run: dict, prepared, provenance: dict[str, Any]) -> None:
        record = {
            "precision": self.precision,
            "precision_meaning": PRECISION_MEANING[self.precision],
            "platform": self.device.platform,
            "device_kind": str(self.device.device_kind),
            "networks_on_device": ["unet"] + (["decoder"] if prepared.decoder_arch is not None else []),
            "on_host": ["scheduler", "initial noise", "guidance mix"],
        }
        if isinstance(prepared, PlannedRun):
            record["plan"] = self._plan_record(prepared, provenance.get("step_times_s") or [])
        provenance["xla"] = record

    @staticmethod
    def _decoder_record(prepared: PlannedRun) -> dict[str, Any]:
        decoder = prepared.decoder
        if decoder is None:
            return {"devices_used": 1, "note": prepared.decoder_note}
        return {
            "devices_used": len(decoder.devices),
            **decoder.split,
            # XLA's memory analysis of the compiled decode, per device (arguments + output + temporaries).
            "memory_per_device_bytes": decoder.memory.get("total_bytes"),
            "collectives": decoder.collectives,
        }

    def _plan_record(self, prepared: PlannedRun, step_times_s: list[float]) -> dict[str, Any]:
        """The plan a run used, where its devices were, and its measured step time beside the predicted one."""
        resolved, unet = prepared.resolved, prepared.unet
        measured = round(float(np.median(step_times_s)) * 1e3, 4) if step_times_s else None
        record = {
            "requested": resolved.requested,
            "name": resolved.plan.name,
            "kind": resolved.plan.kind,
            "mesh": unet.mesh_shape,
            "levels": resolved.plan.level_labels(),
            "placement": resolved.placement,
            "logical_to_device": [int(d.id) for d in unet.devices],
            "devices_used": len(unet.devices),
            "devices_available": len(self.devices),
            "topology": resolved.topology,
            "predicted_step_ms": resolved.predicted_step_ms,
            "prediction": resolved.prediction,
            "measured_median_step_ms": measured,
            "measured_on": f"{len(unet.devices)} x {self.device.platform} {self.device.device_kind}",
            "planning_s": round(resolved.planning_s, 3),
            "collectives_per_step": unet.collectives,
            "sharded": ["unet"] + (["decoder"] if prepared.decoder is not None else []),
            "decoder": self._decoder_record(prepared),
        }
        if self.host_stand_ins:
            record["host_stand_ins"] = True
            record["measured_note"] = "measured on fake host devices: not comparable to TPU speed"
        return record
