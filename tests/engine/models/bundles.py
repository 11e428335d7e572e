"""Write MONAI model-zoo bundle folders for tests, laid out like brain_image_synthesis_latent_diffusion_model."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.models.reference import BUNDLE_AUTOENCODER, BUNDLE_UNET

# The real brain bundle's networks: engine.models.reference's one definition, with the class paths a
# bundle's JSON names them by.
BRAIN_BUNDLE_AUTOENCODER = {**BUNDLE_AUTOENCODER, "_target_": "monai.networks.nets.AutoencoderKL"}
BRAIN_BUNDLE_UNET = {
    **BUNDLE_UNET,
    "_target_": "monai.networks.nets.DiffusionModelUNet",
    "use_flash_attention": False,
}
SCALED_AUTOENCODER = dict(
    BRAIN_BUNDLE_AUTOENCODER, channels=[8, 8, 8, 8], norm_num_groups=4, num_res_blocks=1
)
SCALED_UNET = dict(
    BRAIN_BUNDLE_UNET,
    channels=[8, 16, 16],
    norm_num_groups=4,
    num_head_channels=[0, 16, 16],
    num_res_blocks=1,
)


def old_state_dict(state: dict) -> dict:
    """Rename a MONAI-core DiffusionModelUNet state dict to the MONAI GenerativeModels (pre-1.4) names."""
    old = {}
    for key, value in state.items():
        if "transformer_blocks" in key and ".out_proj." in key:
            key = key.replace(".out_proj.", ".to_out.0.")
        key = key.replace("postconv", "conv")
        old[key] = value
    return old


def write_bundle(
    folder: Path,
    *,
    full_size: bool = False,
    load_old: bool = False,
    spatial=(32, 64, 32),
    inference_overrides: dict | None = None,
    seed: int = 0,
) -> Path:
    """A bundle with random (perturbed) weights. ``full_size`` uses the real brain bundle's architecture."""
    from engine.models.networks import build_network
    from engine.models.reference import perturb_

    ae_def = BRAIN_BUNDLE_AUTOENCODER if full_size else SCALED_AUTOENCODER
    unet_def = BRAIN_BUNDLE_UNET if full_size else SCALED_UNET
    if full_size:
        spatial = (160, 224, 160)
    (folder / "configs").mkdir(parents=True, exist_ok=True)
    (folder / "models").mkdir(exist_ok=True)
    inference = {
        "imports": ["$import torch", "$from datetime import datetime", "$from pathlib import Path"],
        "bundle_root": ".",
        "load_old": int(load_old),
        "model_dir": "$@bundle_root + '/models'",
        "gender": 0.0,
        "age": 0.1,
        "ventricular_vol": 0.2,
        "brain_vol": 0.4,
        "device": "$torch.device('cuda:0' if torch.cuda.is_available() else 'cpu')",
        "conditioning": "$torch.tensor([[@gender, @age, @ventricular_vol, @brain_vol]]).to(@device).unsqueeze(1)",
        "autoencoder_def": ae_def,
        "network_def": "@autoencoder_def",
        "load_autoencoder_path": "$@model_dir + '/autoencoder.pt'",
        "diffusion_def": unet_def,
        "load_diffusion_path": "$@model_dir + '/model.pt'",
        "scheduler": {
            "_target_": "monai.networks.schedulers.DDIMScheduler",
            "_requires_": ["@load_diffusion"],
            "beta_start": 0.0015,
            "beta_end": 0.0205,
            "num_train_timesteps": 1000,
            "schedule": "scaled_linear_beta",
            "clip_sample": False,
        },
        "noise": "$torch.randn((1, 3, 20, 28, 20)).to(@device)",
    }
    inference.update(inference_overrides or {})
    metadata = {
        "version": "1.0.0",
        "monai_version": "1.4.0",
        "task": "Brain image synthesis",
        "description": "test bundle with random weights",
        "image_classes": "T1w head MRI with 1x1x1 mm voxel size",
        "network_data_format": {
            "inputs": {
                "image": {
                    "type": "tabular",
                    "num_channels": 1,
                    "value_range": [0, 1],
                    "channel_def": {
                        "0": "Gender",
                        "1": "Age",
                        "2": "Ventricular volume",
                        "3": "Brain volume",
                    },
                }
            },
            "outputs": {
                "pred": {
                    "type": "image",
                    "num_channels": 1,
                    "spatial_shape": list(spatial),
                    "value_range": [0, 1],
                    "modality": "MR",
                }
            },
        },
    }
    (folder / "configs" / "inference.json").write_text(json.dumps(inference, indent=2))
    (folder / "configs" / "metadata.json").write_text(json.dumps(metadata, indent=2))
    torch.manual_seed(seed)
    for definition, name in ((ae_def, "autoencoder.pt"), (unet_def, "model.pt")):
        state = perturb_(build_network(definition), 0.02).state_dict()
        if load_old and name == "model.pt":
            state = old_state_dict(state)
        torch.save(state, folder / "models" / name)
    return folder
