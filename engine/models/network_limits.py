"""Bounds on every size field of a network definition, checked before anything is built from it.

A model folder is untrusted input, and MONAI builds whatever it is told: ``num_res_blocks: 100000``
constructs millions of modules (minutes at 100 % CPU, even on torch's ``meta`` device), and a huge
``num_class_embeds`` or ``transformer_num_layers`` does the same. So each argument of the allow-listed
classes that sizes something has a range here, wide enough for every published brain model (MONAI's
model zoo, NV-Generate's MAISI v2: channels up to 768, 2 residual blocks, 1 transformer layer) and far
below what would hang or exhaust a workstation. Combinations that pass every bound but are still too big
are refused by the memory estimate (``engine.models.budget``), computed from these fields, not by building.

Every refusal is one line naming the field, the value and the allowed range.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from engine.errors import ModelInvalid

MAX_LEVELS = 8  # resolution levels of a U-Net or autoencoder (MAISI: 4, the demo: 3)
MAX_LEVEL_CHANNELS = 16_384  # feature channels at one level (published 3D models stop at 768)
MAX_IO_CHANNELS = 256  # image/latent channels in or out, conditions concatenated included
MAX_LATENT_CHANNELS = 64  # the spec's own bound on latent_shape's channels (engine.models.spec)
MAX_RES_BLOCKS = 16  # residual blocks per level (published: 1 or 2)
MAX_TRANSFORMER_LAYERS = 16  # transformer layers per attention block (published: 1)
MAX_NORM_GROUPS = 1024
MAX_EMBEDDING = 4096  # class embeddings, cross-attention context width
MAX_SPLITS = 128  # MAISI's autoencoder splits its input in num_splits pieces along one axis
#: Attention layers in a whole U-Net (attention blocks x transformer_num_layers). Each field may be in
#: range while their product is not: 8 levels x 33 blocks x 16 layers built 128k modules in 13 s here.
#: Published models have about a dozen (MAISI v2: 11; MONAI's brain LDM: 11).
MAX_ATTENTION_LAYERS_IN_ALL = 256


def _whole(low: int, high: int):
    def check(value: Any, where: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ModelInvalid(f"{where} is {_show(value)}; allowed: a whole number from {low:,} to {high:,}")

    return check


def _optional(check):
    def optional(value: Any, where: str) -> None:
        if value is not None:
            check(value, where)

    return optional


def _whole_or_list(low: int, high: int):
    """One whole number, or one per level (at most MAX_LEVELS)."""
    each = _whole(low, high)

    def check(value: Any, where: str) -> None:
        if isinstance(value, list | tuple):
            _length(value, where)
            for index, item in enumerate(value):
                each(item, f"{where}[{index}]")
        else:
            each(value, where)

    return check


def _list_of(low: int, high: int):
    """A list with one whole number per level (1 to MAX_LEVELS of them)."""
    each = _whole(low, high)

    def check(value: Any, where: str) -> None:
        if not isinstance(value, list | tuple):
            raise ModelInvalid(
                f"{where} is {_show(value)}; allowed: a list of 1 to {MAX_LEVELS} whole numbers from "
                f"{low:,} to {high:,}"
            )
        _length(value, where)
        for index, item in enumerate(value):
            each(item, f"{where}[{index}]")

    return check


def _length(value: list | tuple, where: str) -> None:
    if not 1 <= len(value) <= MAX_LEVELS:
        raise ModelInvalid(f"{where} has {len(value):,} entries; allowed: 1 to {MAX_LEVELS} (one per level)")


def _flags(value: Any, where: str) -> None:
    if not isinstance(value, list | tuple):
        raise ModelInvalid(f"{where} is {_show(value)}; allowed: a list of true/false, one per level")
    _length(value, where)
    for index, item in enumerate(value):
        _flag(item, f"{where}[{index}]")


def _flag(value: Any, where: str) -> None:
    if not (isinstance(value, bool) or (isinstance(value, int) and value in (0, 1))):
        raise ModelInvalid(f"{where} is {_show(value)}; allowed: true or false")


def _number(low: float, high: float, low_open: bool = False):
    def check(value: Any, where: str) -> None:
        ok = (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and (low < value if low_open else low <= value)
            and value <= high
        )
        if not ok:
            bracket = "(" if low_open else "["
            raise ModelInvalid(f"{where} is {_show(value)}; allowed: a number in {bracket}{low:g}, {high:g}]")

    return check


def _spatial_dims(value: Any, where: str) -> None:
    if isinstance(value, bool) or value != 3:
        raise ModelInvalid(f"{where} is {_show(value)}; allowed: 3 (VolSynth makes 3D volumes)")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


#: argument name -> its check; the arguments of every allow-listed class (engine.models.networks) are here,
#: which a test checks against MONAI's signatures so a new size field cannot slip past unbounded.
FIELD_CHECKS = {
    "spatial_dims": _spatial_dims,
    "in_channels": _whole(1, MAX_IO_CHANNELS),
    "out_channels": _whole(1, MAX_IO_CHANNELS),
    "conditioning_embedding_in_channels": _whole(1, MAX_IO_CHANNELS),
    "latent_channels": _whole(1, MAX_LATENT_CHANNELS),
    "channels": _list_of(1, MAX_LEVEL_CHANNELS),
    "num_channels": _list_of(1, MAX_LEVEL_CHANNELS),
    "conditioning_embedding_num_channels": _list_of(1, MAX_LEVEL_CHANNELS),
    "attention_levels": _flags,
    "num_res_blocks": _whole_or_list(0, MAX_RES_BLOCKS),
    "num_head_channels": _whole_or_list(0, MAX_LEVEL_CHANNELS),
    "norm_num_groups": _whole(1, MAX_NORM_GROUPS),
    "norm_eps": _number(0.0, 1.0, low_open=True),
    "transformer_num_layers": _whole(1, MAX_TRANSFORMER_LAYERS),
    "cross_attention_dim": _optional(_whole(1, MAX_EMBEDDING)),
    "num_class_embeds": _optional(_whole(1, MAX_EMBEDDING)),
    "num_splits": _whole(1, MAX_SPLITS),
    "dim_split": _whole(0, 2),
    "dropout_cattn": _number(0.0, 1.0),
    **{
        name: _flag
        for name in (
            "resblock_updown",
            "with_conditioning",
            "upcast_attention",
            "use_flash_attention",
            "include_fc",
            "use_combined_linear",
            "include_top_region_index_input",
            "include_bottom_region_index_input",
            "include_spacing_input",
            "with_encoder_nonlocal_attn",
            "with_decoder_nonlocal_attn",
            "use_checkpoint",
            "use_checkpointing",
            "use_convtranspose",
            "norm_float16",
            "print_info",
            "save_mem",
        )
    },
}


def check_network_sizes(definition: Mapping[str, Any], where: str) -> None:
    """Refuse (ModelInvalid, one line) a definition with any size field out of its range.

    Runs on the JSON before any class is imported or built. Unknown arguments are left to MONAI, which
    refuses them before building anything (a TypeError on the constructor call).
    """
    for key, value in definition.items():
        check = FIELD_CHECKS.get(key)
        if check is not None:
            check(value, f"{where}.{key}")
    channels = definition.get("channels", definition.get("num_channels"))
    for key in ("attention_levels", "num_res_blocks", "num_head_channels"):
        value = definition.get(key)
        if (
            isinstance(channels, list | tuple)
            and isinstance(value, list | tuple)
            and len(value) != len(channels)
        ):
            raise ModelInvalid(
                f"{where}.{key} has {len(value)} entries but channels has {len(channels)}; give one per level"
            )
    layers = _transformer_layers(definition)
    if layers > MAX_ATTENTION_LAYERS_IN_ALL:
        raise ModelInvalid(
            f"{where} has {layers:,} attention layers in all (attention blocks x transformer_num_layers); "
            f"allowed: at most {MAX_ATTENTION_LAYERS_IN_ALL}"
        )


def _transformer_layers(definition: Mapping[str, Any]) -> int:
    """Attention blocks of a U-Net (down, middle and up paths) times its layers per block; 0 for others."""
    if "transformer_num_layers" not in definition and "with_conditioning" not in definition:
        return 0
    attention = definition.get("attention_levels")
    if not isinstance(attention, list | tuple):
        return 0
    res_blocks = definition.get("num_res_blocks", 2)
    per_level = list(res_blocks) if isinstance(res_blocks, list | tuple) else [res_blocks] * len(attention)
    blocks = 1 + sum(2 * int(n) + 1 for n, on in zip(per_level, attention, strict=False) if on)
    # unconditioned U-Nets attend with one self-attention layer per block, whatever transformer_num_layers says
    return blocks * (
        int(definition.get("transformer_num_layers", 1)) if definition.get("with_conditioning") else 1
    )
