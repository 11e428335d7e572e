"""Tiny seeded random models for tests, benchmarks of the machinery, and bug reports.

They exercise exactly the code paths of real models (same networks, conditioning modes, schedulers, file
format) at a size that samples in well under a second on a laptop CPU. MONAI zero-initialises the U-Net's
output convolution, so a random model would predict zeros everywhere; weights are perturbed to make the
loop do real work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.models.reference import DEMO_CONDITIONS, perturb_, perturbed_networks
from engine.models.spec import ModelSpec
from engine.samplers import FLOW, family_of

TINY_CONDITIONS = DEMO_CONDITIONS  # the shipped demo's two volumes, one definition


def tiny_spec(
    model_id: str = "tiny-latent",
    kind: str = "latent",
    conditioned: bool = True,
    output_xyz: tuple[int, int, int] = (16, 24, 16),
    samplers=("ddim", "ddpm", "pndm"),
    default_guidance_scale: float = 1.0,
) -> ModelSpec:
    """A tiny model of ``kind``. ``samplers[0]`` is its default sampler; the model offers every sampler of that
    sampler's family (a flow gets a flow schedule, the others a DDPM beta schedule)."""
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
        if family_of(samplers[0]) == FLOW
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
    """The spec's networks with seeded, perturbed random weights (the reference models' one builder)."""
    return perturbed_networks(spec, seed, 0.05, frozen=False)


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

        from engine.server.connections import ConnectionLimits, uvicorn_options

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
        from engine.server.connections import GuardedServer

        self.server = GuardedServer(self.config)
        self.server.handshake_timeout_s = (limits or ConnectionLimits()).header_timeout_s
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


# -- NV-Generate-MR-Brain (MAISI v2) folders ----------------------------------------------------------------

#: The real rflow-mr-brain network definitions (NV-Generate-CTMR configs/config_network_rflow.json, facts
#: restated), with the entries this model does not need, kept so opening must ignore them.
MAISI_NETWORK_CONFIG: dict[str, Any] = {
    "spatial_dims": 3,
    "image_channels": 1,
    "latent_channels": 4,
    "include_body_region": False,
    "mask_generation_latent_shape": [4, 64, 64, 64],
    "autoencoder_def": {
        "_target_": "monai.apps.generation.maisi.networks.autoencoderkl_maisi.AutoencoderKlMaisi",
        "spatial_dims": "@spatial_dims",
        "in_channels": "@image_channels",
        "out_channels": "@image_channels",
        "latent_channels": "@latent_channels",
        "num_channels": [64, 128, 256],
        "num_res_blocks": [2, 2, 2],
        "norm_num_groups": 32,
        "norm_eps": 1e-06,
        "attention_levels": [False, False, False],
        "with_encoder_nonlocal_attn": False,
        "with_decoder_nonlocal_attn": False,
        "use_checkpointing": False,
        "use_convtranspose": False,
        "norm_float16": True,
        "num_splits": 4,
        "dim_split": 1,
    },
    "diffusion_unet_def": {
        "_target_": "monai.apps.generation.maisi.networks.diffusion_model_unet_maisi.DiffusionModelUNetMaisi",
        "spatial_dims": "@spatial_dims",
        "in_channels": "@latent_channels",
        "out_channels": "@latent_channels",
        "num_channels": [64, 128, 256, 512],
        "attention_levels": [False, False, True, True],
        "num_head_channels": [0, 0, 32, 32],
        "num_res_blocks": 2,
        "use_flash_attention": True,
        "include_top_region_index_input": "@include_body_region",
        "include_bottom_region_index_input": "@include_body_region",
        "include_spacing_input": True,
        "num_class_embeds": 128,
        "resblock_updown": True,
        "include_fc": True,
    },
    "controlnet_def": {
        "_target_": "monai.apps.generation.maisi.networks.controlnet_maisi.ControlNetMaisi",
        "spatial_dims": "@spatial_dims",
        "in_channels": "@latent_channels",
        "num_channels": [64, 128, 256, 512],
        "conditioning_embedding_in_channels": 8,
    },
    "mask_generation_autoencoder_def": {
        "_target_": "monai.apps.generation.maisi.networks.autoencoderkl_maisi.AutoencoderKlMaisi",
        "spatial_dims": "@spatial_dims",
        "in_channels": 8,
        "out_channels": 125,
        "latent_channels": "@latent_channels",
        "num_channels": [32, 64, 128],
    },
    "mask_generation_diffusion_def": {
        "_target_": "monai.networks.nets.diffusion_model_unet.DiffusionModelUNet",
        "spatial_dims": "@spatial_dims",
        "in_channels": "@latent_channels",
        "out_channels": "@latent_channels",
        "channels": [64, 128, 256, 512],
        "with_conditioning": True,
        "cross_attention_dim": 10,
    },
    # Some versions name a class of the repository's own package: never to be constructed (or refused).
    "mask_generation_helper": {"_target_": "scripts.utils.define_instance", "args": "$print('ran')"},
    "mask_generation_scale_factor": 1.0055984258651733,
    "noise_scheduler": {
        "_target_": "monai.networks.schedulers.rectified_flow.RFlowScheduler",
        "num_train_timesteps": 1000,
        "use_discrete_timesteps": False,
        "use_timestep_transform": True,
        "sample_method": "uniform",
        "scale": 1.4,
    },
    "mask_generation_noise_scheduler": {
        "_target_": "monai.networks.schedulers.ddpm.DDPMScheduler",
        "num_train_timesteps": 1000,
    },
}
MAISI_INFERENCE_CONFIG: dict[str, Any] = {
    "diffusion_unet_train": {"batch_size": 1, "lr": 1e-05, "n_epochs": 1000},
    "diffusion_unet_inference": {
        "dim": [256, 256, 128],
        "spacing": [0.94, 0.94, 1.36],
        "top_region_index": [0, 1, 0, 0],
        "bottom_region_index": [0, 0, 1, 0],
        "random_seed": 1234,
        "num_inference_steps": 30,
        "modality": 9,
        "cfg_guidance_scale": 2,
    },
}
MAISI_ENVIRONMENT = {
    "model_dir": "./models",
    "model_filename": "diff_unet_3d_rflow-mr-brain_v1.pt",
    "output_dir": "./output",
    "trained_autoencoder_path": "models/autoencoder_v1.pt",
    "modality_mapping_path": "./configs/modality_mapping.json",
}
MAISI_MODALITY_MAPPING = {
    "unknown": 0, "ct": 1, "mri": 8, "mri_t1": 9, "mri_t2": 10, "mri_flair": 11, "mri_mra": 16,
    "mri_swi": 20, "mri_t1_skull_stripped": 29, "mri_t2_skull_stripped": 30, "mri_flair_skull_stripped": 31,
    "mri_swi_skull_stripped": 32, "mri_mra_skull_stripped": 33,
}  # fmt: skip
#: Small enough to sample in a second: same classes, same layout, fewer channels.
TINY_MAISI_AUTOENCODER = {
    "num_channels": [8, 8, 16],
    "num_res_blocks": [1, 1, 1],
    "norm_num_groups": 4,
    "num_splits": 2,
}
TINY_MAISI_UNET = {"num_channels": [8, 8, 16, 16], "num_head_channels": [0, 0, 8, 8], "num_res_blocks": 1}


def maisi_definitions(tiny: bool = True) -> dict:
    """The network config, with the tiny channel counts when ``tiny``."""
    import copy

    config = copy.deepcopy(MAISI_NETWORK_CONFIG)
    if tiny:
        config["autoencoder_def"].update(TINY_MAISI_AUTOENCODER)
        config["diffusion_unet_def"].update(TINY_MAISI_UNET)
        config["norm_num_groups_note"] = "tiny: norm_num_groups 4"
        config["diffusion_unet_def"]["norm_num_groups"] = 4
    return config


def build_maisi_networks(tiny: bool = True, seed: int = 0):
    """(U-Net, autoencoder) of the MAISI classes with seeded random weights, perturbed so no layer is zero."""
    import torch

    from engine.models.bundle import _resolve
    from engine.models.networks import build_network

    config = maisi_definitions(tiny)
    torch.manual_seed(seed)
    unet = build_network(_resolve(config, config["diffusion_unet_def"]), "diffusion_unet_def")
    ae_def = {**_resolve(config, config["autoencoder_def"]), "norm_float16": False}
    autoencoder = build_network(ae_def, "autoencoder_def")
    generator = torch.Generator().manual_seed(seed + 1)
    for net in (unet, autoencoder):
        perturb_(net, 0.02, generator)
    return unet.eval(), autoencoder.eval()


def write_maisi_folder(
    folder: str | Path,
    *,
    tiny: bool = True,
    seed: int = 0,
    flat: bool = False,
    scale_factor: float = 1.25,
    dim: tuple[int, int, int] | None = None,
    spacing: tuple[float, float, float] | None = None,
    docs: bool = True,
) -> Path:
    """An NV-Generate-MR-Brain folder as its download script leaves it (``flat``: the files in one folder).

    ``dim``/``spacing`` replace the default 256x256x128 at 0.94x0.94x1.36 mm in the inference config (tests
    use small volumes). ``docs``: write README.md / docs/inference.md with the licence and FOV table.
    """
    import copy
    import json

    import torch

    folder = Path(folder)
    configs = folder if flat else folder / "configs"
    models = folder if flat else folder / "models"
    configs.mkdir(parents=True, exist_ok=True)
    models.mkdir(parents=True, exist_ok=True)
    inference = copy.deepcopy(MAISI_INFERENCE_CONFIG)
    if dim is not None:
        inference["diffusion_unet_inference"]["dim"] = list(dim)
    if spacing is not None:
        inference["diffusion_unet_inference"]["spacing"] = list(spacing)
    files = {
        "config_network_rflow.json": maisi_definitions(tiny),
        "config_maisi_diff_model_rflow-mr-brain.json": inference,
        "environment_maisi_diff_model_rflow-mr-brain.json": MAISI_ENVIRONMENT,
        "modality_mapping.json": MAISI_MODALITY_MAPPING,
    }
    for name, data in files.items():
        (configs / name).write_text(json.dumps(data, indent=2))
    unet, autoencoder = build_maisi_networks(tiny, seed)
    torch.save(
        {"unet_state_dict": unet.state_dict(), "scale_factor": torch.tensor(scale_factor), "epoch": 100},
        models / "diff_unet_3d_rflow-mr-brain_v1.pt",
    )
    torch.save(autoencoder.state_dict(), models / "autoencoder_v1.pt")
    if docs:
        (folder / "docs").mkdir(exist_ok=True)
        (folder / "README.md").write_text(
            "| | `rflow-mr-brain` | `rflow-mr` |\n|---|---|---|\n"
            "| **License** | [NVIDIA Open Model](https://example.invalid) | [NVIDIA Non-Commercial](x) |\n"
        )
        (folder / "docs" / "inference.md").write_text(
            "## Recommended FOV for MR `rflow-mr-brain` model\n\n"
            "| Modality | Plane | Recommended FOV (mm) | v0 | v1 |\n|---|---|---|---:|---:|\n"
            "| T1 | axial | 240 × 240 × 174 | 1 | 2 |\n| T2 | axial | 240 × 240 × 158 | 1 | 2 |\n"
            "| FLAIR | axial | 250 × 250 × 175 | 1 | 2 |\n| SWI | axial | 230 × 230 × 145 | 1 | 2 |\n"
            "\n## Modality codes\n\n| T1 | axial | 1 × 1 × 1 | 0 | 0 |\n"
        )
    return folder
