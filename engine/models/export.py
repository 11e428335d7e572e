"""Write a VolSynth model folder: spec.json, weights.safetensors and MODEL_CARD.md."""

from __future__ import annotations

import json
from pathlib import Path

from engine.models.source import CARD_FILE, SPEC_FILE, WEIGHTS_FILE
from engine.models.spec import ModelSpec
from engine.nifti.io import atomic_files


def save_model_folder(folder: str | Path, spec: ModelSpec, networks: dict, card: str = "") -> Path:
    """Save ``networks`` (role -> torch module, e.g. {"unet": ..., "autoencoder": ...}) with their spec.

    Tensors are stored contiguous, on the CPU, in float32, named ``<role>.<parameter>``.
    """
    from safetensors.torch import save_file

    spec.validate()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for role, net in networks.items():
        for name, tensor in net.state_dict().items():
            tensors[f"{role}.{name}"] = tensor.detach().to("cpu").contiguous().clone()
    targets = [folder / WEIGHTS_FILE, folder / SPEC_FILE] + ([folder / CARD_FILE] if card else [])
    with atomic_files(targets) as temps:
        save_file(tensors, str(temps[0]), metadata={"format": "volsynth-model/1", "id": spec.id})
        temps[1].write_text(json.dumps(spec.to_dict(), indent=2) + "\n", encoding="utf-8")
        if card:
            temps[2].write_text(card, encoding="utf-8")
    return folder
