"""The planner's view of MAISI v2's latent U-Net (``DiffusionModelUNetMaisi``), beside the DiffusionModelUNet one.

``engine.xla.planner.network_from_definition`` reads DiffusionModelUNet definitions; this builds the same
``Network`` for a MAISI definition with the MAISI port (``engine.xla.nets.maisi_denoiser_apply``), whose
context is the packed (B, 1, 4) class label + spacing every MAISI denoiser takes in VolSynth.
"""

from __future__ import annotations

from collections.abc import Sequence

MAISI_CONTEXT_DIM = 4  # class label, spacing x 100 on three axes (engine.models.maisi.maisi_denoiser)


def is_maisi_definition(definition: dict) -> bool:
    from engine.models.networks import short_target

    return short_target(definition.get("_target_", "")) == "DiffusionModelUNetMaisi"


def maisi_network(
    name: str,
    definition: dict,
    latent_spatial: Sequence[int],
    batch: int = 1,
    cfg: bool = True,
    precision: str = "default",
):
    """A planner ``Network`` for a DiffusionModelUNetMaisi definition (built on torch's meta device)."""
    from engine.xla.convert import abstract_params, maisi_unet_arch, meta_network
    from engine.xla.nets import maisi_denoiser_apply
    from engine.xla.planner import Network

    module = meta_network(definition)
    arch = maisi_unet_arch(module)
    return Network(
        name=name,
        arch=arch,
        params=abstract_params(module),
        apply=maisi_denoiser_apply,
        spatial=tuple(int(s) for s in latent_spatial),
        in_channels=int(arch.in_channels),
        context_dim=MAISI_CONTEXT_DIM,
        batch=batch * (2 if cfg else 1),
        levels=int(arch.levels),
        precision=precision,
        cfg=cfg,
    )
