"""Tiny seeded random models for tests, benchmarks of the machinery, and bug reports.

They exercise exactly the code paths of real models (same networks, conditioning modes, schedulers, file
format) at a size that samples in well under a second on a laptop CPU. MONAI zero-initialises the U-Net's
output convolution, so a random model would predict zeros everywhere; weights are perturbed to make the
loop do real work.
"""

from __future__ import annotations

from pathlib import Path

from engine.models.spec import ConditionSpec, ModelSpec

TINY_CONDITIONS = (
    ConditionSpec("brain_volume", "Brain volume", "mL", 900.0, 1500.0, 1200.0),
    ConditionSpec("ventricle_volume", "Ventricle volume", "mL", 5.0, 80.0, 25.0),
)


def tiny_spec(
    model_id: str = "tiny-latent",
    kind: str = "latent",
    conditioned: bool = True,
    output_xyz: tuple[int, int, int] = (16, 24, 16),
    samplers=("ddim", "ddpm", "pndm"),
    default_guidance_scale: float = 1.0,
) -> ModelSpec:
    conditions = TINY_CONDITIONS if conditioned else ()
    n = len(conditions)
    latent_channels = 3
    image_channels = 1
    if kind == "latent":
        factor = 4
        latent_shape = (latent_channels, *(s // factor for s in output_xyz))
        diff_channels = latent_channels
    else:
        latent_shape = None
        diff_channels = image_channels
    unet = {
        "_target_": "DiffusionModelUNet",
        "spatial_dims": 3,
        "in_channels": diff_channels + (n if conditioned else 0),
        "out_channels": diff_channels,
        "channels": [8, 16],
        "attention_levels": [False, True],
        "num_res_blocks": 1,
        "norm_num_groups": 8,
        "num_head_channels": [0, 8],
        "with_conditioning": conditioned,
        "cross_attention_dim": n if conditioned else None,
        "resblock_updown": False,
    }
    networks = {"unet": unet}
    if kind == "latent":
        networks["autoencoder"] = {
            "_target_": "AutoencoderKL",
            "spatial_dims": 3,
            "in_channels": 1,
            "out_channels": 1,
            "latent_channels": latent_channels,
            "channels": [8, 8, 8],
            "num_res_blocks": 1,
            "attention_levels": [False, False, False],
            "norm_num_groups": 4,
            "with_encoder_nonlocal_attn": False,
            "with_decoder_nonlocal_attn": False,
        }
    schedule = (
        {"num_train_timesteps": 1000}
        if samplers == ("rflow",)
        else {
            "num_train_timesteps": 1000,
            "schedule": "scaled_linear_beta",
            "beta_start": 0.0015,
            "beta_end": 0.0205,
            "prediction_type": "epsilon",
            "clip_sample": False,
        }
    )
    return ModelSpec(
        id=model_id,
        name=f"Tiny {kind} test model",
        kind=kind,
        networks=networks,
        schedule=schedule,
        output_shape=(image_channels, *output_xyz),
        latent_shape=latent_shape,
        samplers=tuple(samplers),
        default_sampler=samplers[0],
        default_steps=5,
        scale_factor=1.0,
        voxel_spacing_mm=(2.0, 2.0, 2.0),
        conditioning=conditions,
        conditioning_modes=("concat", "crossattn") if conditioned else (),
        guidance_null_value=-1.0 if conditioned else None,
        default_guidance_scale=default_guidance_scale,
        description="random weights; for tests only",
    )


def build_tiny_networks(spec: ModelSpec, seed: int = 0) -> dict:
    import torch

    from engine.models.networks import build_network

    torch.manual_seed(seed)
    built = {}
    for role, definition in spec.networks.items():
        net = build_network(definition, where=role)
        with torch.no_grad():
            for param in net.parameters():
                param.add_(torch.randn_like(param) * 0.05)
        built[role] = net.eval()
    return built


def make_tiny_model(folder: str | Path, seed: int = 0, **spec_kwargs) -> Path:
    """Write a tiny random model folder and return its path."""
    from engine.models.export import save_model_folder

    spec = tiny_spec(**spec_kwargs)
    return save_model_folder(
        folder,
        spec,
        build_tiny_networks(spec, seed),
        card=f"# {spec.name}\n\nRandom weights (seed {seed}). For tests only.\n",
    )


class InstantBackend:
    """A backend that answers at once (a few progress events, a small zero volume), for exercising the
    engine server's HTTP layer (fuzzing, load) without spending CPU on sampling. ``registry`` is the model
    registry the server restricts requests to.
    """

    name = "instant"

    def __init__(self, registry) -> None:
        self.registry = registry

    def info(self):
        from engine.api import BackendInfo

        return BackendInfo(self.name, "cpu", "instant test backend")

    def sample(self, request):
        import numpy as np

        from engine.api import Progress, SamplingResult

        yield Progress("load", 0, 1, 0.0)
        total = min(request.steps or 3, 3)
        for step in range(1, total + 1):
            preview = np.zeros((4, 4, 4), np.float32) if request.preview_interval else None
            yield Progress("denoise", step, total, 0.001 * step, "", preview)
        volumes = np.zeros((request.batch_size, 1, 4, 4, 4), np.float32)
        provenance = {"model": {"id": request.model}, "seed": request.seed, "backend": self.name}
        return SamplingResult(volumes, np.eye(4), request, provenance)


class ServerThread:
    """A real uvicorn engine server on 127.0.0.1 (a free port) in a daemon thread, for tests and demos.

    ``with ServerThread(create_app(...)) as url:`` starts it and waits until it listens; leaving the block
    stops it. With ``ssl_certfile``/``ssl_keyfile`` it serves HTTPS and the URL starts with ``https://``;
    The connection limits are the ones ``volsynth serve`` runs with (``app.state.limits.connections``);
    other keyword arguments go to ``uvicorn.Config`` and override them.
    """

    def __init__(self, app, ssl_certfile=None, ssl_keyfile=None, **config) -> None:
        import threading

        import uvicorn

        from engine.server_connections import ConnectionLimits, uvicorn_options

        limits = getattr(getattr(getattr(app, "state", None), "limits", None), "connections", None)
        self.connection_options = uvicorn_options(limits or ConnectionLimits())
        config = {**self.connection_options, **config}
        config.setdefault("log_level", "warning")
        config.setdefault("timeout_graceful_shutdown", 5)
        self.scheme = "https" if ssl_certfile else "http"
        self.config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            lifespan="off",
            ssl_certfile=None if ssl_certfile is None else str(ssl_certfile),
            ssl_keyfile=None if ssl_keyfile is None else str(ssl_keyfile),
            **config,
        )
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = ""

    def __enter__(self) -> str:
        import time

        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"{self.scheme}://127.0.0.1:{port}"
        return self.url

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        if self.thread.is_alive():  # open streams hold the graceful shutdown: end them
            self.server.force_exit = True
            self.thread.join(timeout=10)
