"""Plan a model by name: the entry point ``volsynth plan`` and the engine server's ``POST /plan`` share."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.errors import BackendUnavailable, InvalidRequest, ModelInvalid, ModelNotFound
from engine.xla.planner import DEFAULT_TIME_LIMIT_S

# MONAI's brain latent-diffusion bundle U-Net, by architecture only (no weights needed to plan).
BUNDLE_MODEL = "brain-ldm-bundle"
# The Med-DDPM-like pixel-space 128^3 U-Net of the GPU check (engine.models.reference.MED_DDPM_UNET).
MED_DDPM_MODEL = "med-ddpm-128"
# MAISI v2's latent U-Net (the NV-Generate brain config) at its 4x64x64x32 latent.
MAISI_MODEL = "maisi-v2-brain"
# Reference architectures planned by name, beside registered model ids and folders.
REFERENCE_MODELS = (BUNDLE_MODEL, MED_DDPM_MODEL, MAISI_MODEL)
DEFAULT_COMPILE_TOP = 3
# Planning stops starting compiles after this many seconds and returns the best plan so far, saying so.
MAX_TIME_LIMIT_S = 3600.0  # the most a server request may ask for
# The most plans a server compiles by estimate for one request (plus the unaware favourite; each full-size
# compile takes minutes).
MAX_COMPILE_TOP = 8
MAX_PLANNED_DEVICES = 256  # placements and collective groups are enumerated per device

# TPU device kinds as jax reports them -> the family names topologies use.
_TPU_FAMILIES = {"TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5": "v5p", "TPU v5p": "v5p"}


def network_for_model(model: str, batch: int, cfg: bool, registry=None):
    """The planner's view of a model's U-Net: a registered id or folder, or one of ``REFERENCE_MODELS``."""
    from engine.xla.planner import network_from_definition

    if model == MED_DDPM_MODEL:
        from engine.models.reference import MED_DDPM_INPUT, MED_DDPM_UNET

        return network_from_definition(
            MED_DDPM_MODEL, dict(MED_DDPM_UNET), MED_DDPM_INPUT[2:], batch=batch, cfg=cfg
        )
    if model == MAISI_MODEL:
        from engine.models.reference import MAISI_LATENT, MAISI_UNET

        return network_from_definition(MAISI_MODEL, dict(MAISI_UNET), MAISI_LATENT[1:], batch=batch, cfg=cfg)
    if model == BUNDLE_MODEL:
        from engine.models.reference import bundle_sized_spec

        spec, name = bundle_sized_spec(), BUNDLE_MODEL
    else:
        from engine.models.registry import ModelRegistry

        try:
            spec = (registry or ModelRegistry()).get(model or None).spec
        except ModelNotFound as exc:
            # Still one line: the registry's own list, then the architectures that plan by name.
            raise ModelNotFound(f"{exc} (or plan a reference U-Net: {', '.join(REFERENCE_MODELS)})") from None
        name = spec.id
    if spec.kind == "latent" and spec.latent_shape is None:
        raise ModelInvalid(f"model {name} has no latent shape to plan for")
    shape = spec.latent_shape if spec.latent_shape is not None else spec.output_shape
    return network_from_definition(name, spec.networks["unet"], tuple(shape)[1:], batch=batch, cfg=cfg)


def plan_model(
    model: str,
    topology: str,
    batch: int = 1,
    cfg: bool = True,
    compile_top: int = DEFAULT_COMPILE_TOP,
    registry=None,
    progress: Callable[[str], None] | None = None,
    *,
    time_limit_s: float | None = DEFAULT_TIME_LIMIT_S,
    whole_compile: bool = False,
    use_cache: bool = True,
    analysis: str | None = None,
):
    """Check the arguments, set JAX up for the topology and run the planner; returns its PlanResult.

    ``time_limit_s`` (None: no limit) makes the planner return its best plan so far, marked cut short, once
    passed; ``whole_compile`` compiles each survivor as one program for the topology (the slow reference)
    instead of its distinct U-Net blocks; ``use_cache`` reads and keeps finished plans and compiled blocks
    in the plan cache (``engine.xla.plan_cache``). ``analysis`` ("blocks", "whole", "host-whole") overrides
    ``whole_compile``.
    """
    from engine.xla.topology import UnknownTopology, parse_topology

    if batch < 1:
        raise InvalidRequest(f"batch must be at least 1, got {batch}")
    if compile_top < 1:
        raise InvalidRequest(f"compile_top must be at least 1, got {compile_top}")
    if time_limit_s is not None and not time_limit_s >= 0:
        raise InvalidRequest(f"the planning-time limit must be 0 s or more, got {time_limit_s}")
    try:
        parsed = parse_topology(topology)
    except UnknownTopology as exc:
        raise InvalidRequest(str(exc)) from None

    if parsed.n_devices > MAX_PLANNED_DEVICES:
        raise InvalidRequest(
            f"{parsed.name} has {parsed.n_devices} devices; the planner handles up to {MAX_PLANNED_DEVICES}"
        )
    from engine.xla.runtime import configure_jax

    # GPU boxes are planned on fake host devices, which must exist before JAX's CPU backend starts; TPU
    # slices compile whole programs on libtpu's compile-only devices, and their blocks on host devices
    # (fast) when this process has as many.
    try:
        available = configure_jax(max(8, parsed.n_devices))
    except ModuleNotFoundError as exc:
        raise BackendUnavailable(
            f"planning needs JAX ({exc.name} is missing): pip install 'volsynth-studio[xla]'"
        ) from exc
    if not parsed.is_tpu and available < parsed.n_devices:
        raise InvalidRequest(
            f"{parsed.name} needs {parsed.n_devices} host devices to plan on, but JAX started with "
            f"{available} in this process; plan it with `volsynth plan` in a fresh process"
        )
    from engine.xla.planner import plan

    network = network_for_model(model, batch, cfg, registry)
    try:
        from engine.xla.plan_cache import default_cache, use_for_xla

        cache = default_cache() if use_cache else None
        use_for_xla(cache)  # the compiler's cache lives with the plan cache, or nowhere
        return plan(
            network,
            parsed,
            compile_top=compile_top,
            progress=progress,
            analysis=analysis or ("whole" if whole_compile else "blocks"),
            time_limit_s=time_limit_s,
            cache=cache,
        )
    except UnknownTopology as exc:
        raise InvalidRequest(str(exc)) from None
    except (RuntimeError, ValueError) as exc:  # XLA / libtpu failures outside one plan's compile
        raise BackendUnavailable(
            f"planning failed on this machine: {type(exc).__name__}: {str(exc)[:200]}"
        ) from exc


def topology_of(devices: Sequence) -> str | None:
    """The planner's name for the TPU slice these jax devices form (``v5e:2x4``), or None (CPU, GPU)."""
    if not devices or devices[0].platform != "tpu":
        return None
    family = _TPU_FAMILIES.get(str(devices[0].device_kind))
    coords = [c for d in devices if (c := getattr(d, "coords", None)) is not None]
    if family is None or len(coords) != len(devices):
        return None
    dims = 2 if family == "v5e" else 3
    shape = [max(int(c[axis]) for c in coords) + 1 for axis in range(dims)]
    return f"{family}:{'x'.join(str(s) for s in shape)}"
