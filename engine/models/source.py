"""Open model folders (VolSynth format or MONAI bundle) and load their weights safely.

Opening a folder reads only JSON (fast, no torch): the registry lists models for the app's picker this
way. ``load()`` then builds the networks and loads weights: safetensors for VolSynth folders, and
``torch.load(..., weights_only=True)`` for bundle checkpoints, which refuses pickles that would run code.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import ModelInvalid
from engine.models import networks
from engine.models.spec import ConditionSpec, ModelSpec

WEIGHTS_FILE = "weights.safetensors"
SPEC_FILE = "spec.json"
CARD_FILE = "MODEL_CARD.md"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class ModelSource:
    """A model on disk: its spec and where its weights are. Cheap to create; nothing loaded yet."""

    spec: ModelSpec
    path: Path
    weight_files: dict[str, Path]  # network name ("unet", "autoencoder") -> file
    load_old: bool = False
    card_path: Path | None = None
    _sha256: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def id(self) -> str:
        return self.spec.id

    def model_card(self) -> str:
        if self.card_path and self.card_path.is_file():
            return self.card_path.read_text(encoding="utf-8")
        return ""

    def weights_sha256(self) -> dict[str, str]:
        """sha256 of every weights file, by file name (computed once; weights do not change under us)."""
        for path in set(self.weight_files.values()):
            if path.name not in self._sha256:
                self._sha256[path.name] = sha256_file(path)
        return dict(self._sha256)

    def load(self):
        """Build the networks on the CPU in eval mode and load the weights. Returns a LoadedModel."""
        state = self._read_state_dicts()
        built = {}
        for role in ("unet", "autoencoder"):
            if role not in self.spec.networks:
                continue
            net = networks.build_network(self.spec.networks[role], where=f"networks.{role}")
            _load_state(net, state[role], role, self.load_old)
            built[role] = net.eval().requires_grad_(False)
        return LoadedModel(source=self, unet=built["unet"], autoencoder=built.get("autoencoder"))

    def _read_state_dicts(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for role, path in self.weight_files.items():
            if not path.is_file():
                raise ModelInvalid(
                    f"model {self.id!r}: weights file {path} is missing; reinstall or re-export the model"
                )
            if path.suffix == ".safetensors":
                out[role] = _read_safetensors(path, role)
            else:
                out[role] = _read_torch_checkpoint(path)
        return out


@dataclass
class LoadedModel:
    """A model whose networks are built and weights loaded (on the CPU until ``to``), ready for sampling."""

    source: ModelSource
    unet: Any
    autoencoder: Any = None

    @property
    def spec(self) -> ModelSpec:
        return self.source.spec

    def to(self, device) -> LoadedModel:
        self.unet.to(device)
        if self.autoencoder is not None:
            self.autoencoder.to(device)
        return self


def _read_safetensors(path: Path, role: str) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ModelInvalid(
            f"cannot read {path.name}: {exc}; the file is damaged, re-export the model"
        ) from exc
    prefix = f"{role}."
    picked = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    if not picked:
        raise ModelInvalid(
            f"{path.name} has no tensors for the {role} (expected names starting with {prefix!r})"
        )
    return picked


def _read_torch_checkpoint(path: Path) -> dict[str, Any]:
    import pickle

    import torch

    try:
        checkpoint = torch.load(str(path), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError, AttributeError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelInvalid(
            f"refusing to load checkpoint {path.name}: it is not a plain tensor file ({first_line[:160]}). "
            "It may contain code; only load checkpoints from sources you trust, converted to safetensors."
        ) from exc
    if isinstance(checkpoint, dict) and not all(hasattr(v, "shape") for v in checkpoint.values()):
        for key in ("state_dict", "model", "network"):
            if isinstance(checkpoint.get(key), dict):
                return checkpoint[key]
        raise ModelInvalid(f"checkpoint {path.name} holds no state dict (keys: {list(checkpoint)[:8]})")
    if not isinstance(checkpoint, dict):
        raise ModelInvalid(f"checkpoint {path.name} holds a {type(checkpoint).__name__}, not a state dict")
    return checkpoint


def _load_state(net, state: dict[str, Any], role: str, load_old: bool) -> None:
    try:
        if load_old:
            # Checkpoints from MONAI GenerativeModels use the old attention parameter names.
            net.load_old_state_dict(state)
        else:
            net.load_state_dict(state, strict=True)
    except (RuntimeError, KeyError, AssertionError) as exc:
        message = str(exc).strip().splitlines()[0][:300]
        raise ModelInvalid(f"the {role} weights do not fit its network definition: {message}") from exc


# --------------------------------------------------------------------------------------------- folders


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelInvalid(f"cannot read {path}: {exc}") from exc


def open_volsynth_folder(folder: Path) -> ModelSource:
    data = _read_json(folder / SPEC_FILE)
    if not isinstance(data, dict):
        raise ModelInvalid(f"{folder / SPEC_FILE} must hold a JSON object")
    for role, definition in (data.get("networks") or {}).items():
        networks.check_literal(definition, f"networks.{role}")
        networks.network_class_name(definition)
    spec = ModelSpec.from_dict(data)
    weights = folder / WEIGHTS_FILE
    return ModelSource(
        spec=spec,
        path=folder,
        weight_files={role: weights for role in spec.networks},
        card_path=folder / CARD_FILE,
    )


def snake_case(label: str) -> str:
    return re.sub(r"[^0-9a-zA-Z]+", "_", label).strip("_").lower()


__all__ = ["LoadedModel", "ModelSource", "open_volsynth_folder", "sha256_file", "ConditionSpec", "snake_case"]
