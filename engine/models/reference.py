"""Reference model shapes (the shipped demo, MONAI's brain bundle) with random perturbed weights.

Benchmarks, the XLA planner and the GPU check use them; they sit with the models so library code can.

Random weights say nothing about image quality, but the cost of a network depends only on its shape, so
these give honest speed numbers; numerical-difference numbers on them must be re-measured on trained
weights (see ``volsynth bench`` output notes).
"""

from __future__ import annotations

from pathlib import Path

from engine.models.spec import ConditionSpec, ModelSpec

_SCHEDULE = {
    "num_train_timesteps": 1000,
    "schedule": "scaled_linear_beta",
    "beta_start": 0.0015,
    "beta_end": 0.0205,
    "prediction_type": "epsilon",
    "clip_sample": False,
}

DEMO_CONDITIONS = (
    ConditionSpec("brain_volume", "Brain volume", "mL", 900.0, 1500.0, 1200.0),
    ConditionSpec("ventricle_volume", "Ventricle volume", "mL", 5.0, 80.0, 25.0),
)
BUNDLE_CONDITIONS = (
    ConditionSpec("sex", "Sex (0 female, 1 male)", "", 0.0, 1.0, 0.0),
    ConditionSpec("age", "Age (normalised)", "", 0.0, 1.0, 0.5),
    ConditionSpec("ventricular_volume", "Ventricular volume (normalised)", "", 0.0, 1.0, 0.5),
    ConditionSpec("brain_volume", "Brain volume (normalised)", "", 0.0, 1.0, 0.5),
)

# The MONAI brain latent-diffusion bundle's autoencoder (latent 3x20x28x20 <-> 160x224x160).
BUNDLE_AUTOENCODER = {
    "_target_": "AutoencoderKL",
    "spatial_dims": 3,
    "in_channels": 1,
    "out_channels": 1,
    "latent_channels": 3,
    "channels": [64, 128, 128, 128],
    "num_res_blocks": 2,
    "norm_num_groups": 32,
    "norm_eps": 1e-6,
    "attention_levels": [False, False, False, False],
    "with_encoder_nonlocal_attn": False,
    "with_decoder_nonlocal_attn": False,
}
# The bundle's diffusion U-Net.
BUNDLE_UNET = {
    "_target_": "DiffusionModelUNet",
    "spatial_dims": 3,
    "in_channels": 7,
    "out_channels": 3,
    "channels": [256, 512, 768],
    "num_res_blocks": 2,
    "attention_levels": [False, True, True],
    "norm_num_groups": 32,
    "norm_eps": 1e-6,
    "resblock_updown": True,
    "num_head_channels": [0, 512, 768],
    "with_conditioning": True,
    "transformer_num_layers": 1,
    "cross_attention_dim": 4,
    "upcast_attention": True,
}

# A Med-DDPM-like pixel-space 3D U-Net (the workload of the project's GPU-optimization source paper): image +
# one conditioning mask channel (Med-DDPM concatenates the segmentation mask) on 1x2x128^3, channels
# (64, 128, 256, 512), one res block per level, self-attention only at the 16^3 level (Med-DDPM's attention
# resolution), 64-channel heads. The GPU check and the XLA planner (``volsynth plan --model med-ddpm-128``)
# both use this one definition.
MED_DDPM_NAME = "med-ddpm-128"
MED_DDPM_UNET = {
    "_target_": "DiffusionModelUNet",
    "spatial_dims": 3,
    "in_channels": 2,
    "out_channels": 1,
    "channels": [64, 128, 256, 512],
    "num_res_blocks": 1,
    "attention_levels": [False, False, False, True],
    "num_head_channels": 64,
    "norm_num_groups": 32,
}
MED_DDPM_INPUT = (1, 2, 128, 128, 128)  # batch, channels, D, H, W
# Its --cpu-smoke size: the same structure, tiny widths, 16^3.
MED_DDPM_SMOKE_UNET = {
    **MED_DDPM_UNET,
    "channels": [8, 16, 16, 32],
    "num_head_channels": 8,
    "norm_num_groups": 8,
}
MED_DDPM_SMOKE_INPUT = (1, 2, 16, 16, 16)

# MAISI v2's latent U-Net as NV-Generate's rflow-mr-brain config defines it (configs/config_network_rflow.json,
# ``diffusion_unet_def`` with its ``@`` references resolved; engine.testing.MAISI_NETWORK_CONFIG restates the
# whole file, and a test checks the two agree), at the latent of the config's 256x256x128 default volume
# (4x compression per axis). ``volsynth plan --model maisi-v2-brain`` plans it.
MAISI_NAME = "maisi-v2-brain"
MAISI_UNET = {
    "_target_": "monai.apps.generation.maisi.networks.diffusion_model_unet_maisi.DiffusionModelUNetMaisi",
    "spatial_dims": 3,
    "in_channels": 4,
    "out_channels": 4,
    "num_channels": [64, 128, 256, 512],
    "attention_levels": [False, False, True, True],
    "num_head_channels": [0, 0, 32, 32],
    "num_res_blocks": 2,
    "use_flash_attention": True,
    "include_top_region_index_input": False,
    "include_bottom_region_index_input": False,
    "include_spacing_input": True,
    "num_class_embeds": 128,
    "resblock_updown": True,
    "include_fc": True,
}
MAISI_LATENT = (4, 64, 64, 32)  # channels, then the latent of 256x256x128


def demo_shaped_spec() -> ModelSpec:
    """Shaped like the shipped demo model (the networks of its spec.json, which ``volsynth train-demo``
    wrote), random weights."""
    import json

    from engine.files.shipped import resource_path
    from engine.models.registry import DEFAULT_MODEL_ID

    shipped = json.loads(resource_path("models", DEFAULT_MODEL_ID, "spec.json").read_text())
    latent_channels = int(shipped["networks"]["autoencoder"]["latent_channels"])
    return ModelSpec(
        id="bench-demo-shaped",
        name="Demo-shaped benchmark model (random weights)",
        kind="latent",
        networks={"unet": shipped["networks"]["unet"], "autoencoder": shipped["networks"]["autoencoder"]},
        schedule=dict(_SCHEDULE),
        output_shape=(1, 80, 96, 80),
        latent_shape=(latent_channels, 20, 24, 20),
        default_steps=50,
        voxel_spacing_mm=(2.0, 2.0, 2.0),
        conditioning=DEMO_CONDITIONS,
        conditioning_modes=("concat", "crossattn"),
        guidance_null_value=-1.0,
        description="random weights; for benchmarks only",
    )


def bundle_sized_spec() -> ModelSpec:
    """Shaped like MONAI's brain latent-diffusion bundle (latent 3x20x28x20 -> 160x224x160)."""
    return ModelSpec(
        id="bench-bundle-sized",
        name="Brain-bundle-sized benchmark model (random weights)",
        kind="latent",
        networks={"unet": dict(BUNDLE_UNET), "autoencoder": dict(BUNDLE_AUTOENCODER)},
        schedule=dict(_SCHEDULE),
        output_shape=(1, 160, 224, 160),
        latent_shape=(3, 20, 28, 20),
        default_steps=50,
        voxel_spacing_mm=(1.0, 1.0, 1.0),
        conditioning=BUNDLE_CONDITIONS,
        conditioning_modes=("concat", "crossattn"),
        guidance_null_value=-1.0,
        description="random weights; for benchmarks only",
    )


def bundle_half_spec() -> ModelSpec:
    """The brain bundle's networks at half the resolution (latent 3x10x14x10 -> 80x112x80): 1/8 of the
    decode's work, for decoder benchmarks on busy machines."""
    spec = bundle_sized_spec()
    data = spec.to_dict()
    data.update(
        id="bench-bundle-half",
        name="Brain-bundle networks at half resolution (random weights)",
        output_shape=[1, 80, 112, 80],
        latent_shape=[3, 10, 14, 10],
        voxel_spacing_mm=[2.0, 2.0, 2.0],
    )
    return ModelSpec.from_dict(data)


SYNTHETIC_MODELS = {
    "demo-shaped": demo_shaped_spec,
    "bundle-sized": bundle_sized_spec,
    "bundle-half": bundle_half_spec,
}


def perturb_(net, scale: float, generator=None):
    """Add Gaussian noise (``scale`` times unit) to every weight of ``net``, in place; returns ``net``.

    The one perturbation of every random-weight builder (these reference shapes, ``engine.testing``'s tiny
    and MAISI models, the tests' bundle folders): MONAI zero-initialises the U-Net's output convolution, so
    unperturbed weights would predict zeros and every optimization would look lossless. With ``generator``
    the noise comes from it (``torch.randn``), else from the global seed (``torch.randn_like``)."""
    import torch

    with torch.no_grad():
        for param in net.parameters():
            noise = (
                torch.randn_like(param)
                if generator is None
                else torch.randn(param.shape, generator=generator)
            )
            param.add_(noise * scale)
    return net


def perturbed_networks(
    spec: ModelSpec,
    seed: int = 0,
    scale: float = 0.05,
    roles: tuple[str, ...] | None = None,
    *,
    frozen: bool = True,
) -> dict:
    """Build the spec's networks with seeded random weights plus Gaussian noise (:func:`perturb_`), in eval
    mode; ``frozen`` also turns their gradients off (benchmarks; the tests' tiny models keep them)."""
    import torch

    from engine.models.networks import build_network

    torch.manual_seed(seed)
    built = {}
    for role, definition in spec.networks.items():
        if roles is not None and role not in roles:
            continue
        net = perturb_(build_network(definition, where=role), scale).eval()
        built[role] = net.requires_grad_(False) if frozen else net
    return built


def synthetic_model_folder(name: str, root: str | Path, seed: int = 0) -> Path:
    """Write (once) and return a model folder for one of ``SYNTHETIC_MODELS``."""
    from engine.models.export import save_model_folder

    spec = SYNTHETIC_MODELS[name]()
    folder = Path(root) / f"{spec.id}-seed{seed}"
    if not (folder / "spec.json").is_file():
        save_model_folder(
            folder,
            spec,
            perturbed_networks(spec, seed),
            card=f"# {spec.name}\n\nRandom perturbed weights (seed {seed}). Benchmarks only.\n",
        )
    return folder
