"""Open model folders (VolSynth format or MONAI bundle) and load their weights safely.

Opening a folder reads only JSON (fast, no torch): the registry lists models for the app's picker this
way. ``load()`` then builds the networks and loads weights: safetensors for VolSynth folders, and
``torch.load(..., weights_only=True)`` for bundle checkpoints, which refuses pickles that would run code.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import EngineError, ModelInvalid, OutOfMemory
from engine.models import networks
from engine.models.spec import ConditionSpec, ModelSpec, one_line

WEIGHTS_FILE = "weights.safetensors"
SPEC_FILE = "spec.json"
CARD_FILE = "MODEL_CARD.md"
#: Limits on the JSON files of a model folder: a spec or bundle config is a few kB; nesting is shallow.
MAX_JSON_BYTES = 4 << 20
MAX_JSON_DEPTH = 32
MAX_CARD_BYTES = 1 << 20


def inside(folder: Path, path: Path, what: str) -> Path:
    """``path`` resolved, refused unless it stays inside the model folder (a symlink may not leave it).

    The folder itself may be a link (a models folder pointing at a data disk); what it holds may not point
    elsewhere: a model is untrusted input and must not make VolSynth read, hash or show other files.
    """
    root = folder.resolve()
    try:
        real = path.resolve()
    except (OSError, RuntimeError) as exc:  # symlink loops
        raise ModelInvalid(f"{what} {path.name} cannot be resolved ({one_line(str(exc))})") from None
    if real != root and root not in real.parents:
        raise ModelInvalid(
            f"{what} {path.relative_to(folder) if path.is_relative_to(folder) else path.name} is a link to "
            f"{real}, outside the model folder {folder}; refusing to read it (copy the file into the folder)"
        )
    return real


def json_depth_ok(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether JSON text nests at most ``limit`` levels (checked before parsing: no RecursionError)."""
    depth = 0
    in_string = False
    escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return False
        elif char in "]}":
            depth -= 1
    return True


def read_json_limited(path: Path, folder: Path, what: str = "model file") -> Any:
    """A model folder's JSON file, within the folder and the size and nesting limits; one-line errors."""
    real = inside(folder, path, what)
    try:
        size = os.stat(real).st_size
        if size > MAX_JSON_BYTES:
            raise ModelInvalid(
                f"{path.name} is {size:,} bytes; a model's JSON files are at most {MAX_JSON_BYTES:,} bytes"
            )
        text = real.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelInvalid(f"cannot read {path}: {one_line(str(exc))}") from None
    if not json_depth_ok(text):
        raise ModelInvalid(
            f"{path.name} nests more than {MAX_JSON_DEPTH} levels deep; it is not a model spec VolSynth reads"
        )
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ModelInvalid(f"{path.name} is not valid JSON: {one_line(str(exc))}") from None


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
        """The model card's text ("" when there is none, or when it is not a readable file inside the
        model folder: opening the folder already refused links that leave it)."""
        if not self.card_path or not self.card_path.is_file():
            return ""
        try:
            real = inside(self.path, self.card_path, "model card")
            with open(real, "rb") as handle:
                return handle.read(MAX_CARD_BYTES).decode("utf-8", "replace")
        except (OSError, ModelInvalid):
            return ""

    def weights_sha256(self) -> dict[str, str]:
        """sha256 of every weights file, by file name (computed once; weights do not change under us)."""
        for path in set(self.weight_files.values()):
            if path.name not in self._sha256:
                self._sha256[path.name] = sha256_file(path)
        return dict(self._sha256)

    def memory_estimate(self) -> dict[str, int]:
        """Bytes loading this model and sampling one volume will need, from the spec alone (nothing is
        allocated: parameters are counted from the definitions, see engine.models.budget)."""
        from engine.models.budget import estimate_model_memory

        files = {}
        for path in set(self.weight_files.values()):
            try:
                files[path.name] = path.stat().st_size
            except OSError:
                files[path.name] = 0
        return estimate_model_memory(self.spec, sum(files.values()))

    def check_memory(self) -> dict[str, int]:
        """Refuse (OutOfMemory, with the estimate and what is available) a model that cannot fit."""
        from engine.formatting import format_bytes
        from engine.nifti.checks import available_memory

        estimate = self.memory_estimate()
        available = available_memory()
        if estimate["total"] > available:
            parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in estimate.items() if k != "total" and v)
            raise OutOfMemory(
                f"model {self.id!r} would need about {format_bytes(estimate['total'])} of memory ({parts}), "
                f"but only {format_bytes(available)} is available; use a smaller model or a machine with "
                "more memory"
            )
        return estimate

    def load(self):
        """Build the networks on the CPU in eval mode and load the weights. Returns a LoadedModel.

        The memory the spec implies is estimated first and refused if it is not available, so a hostile
        or mistaken spec (enormous shapes, channels) fails with a message instead of exhausting memory.
        """
        self.check_memory()
        try:
            state = self._read_state_dicts()
            built = {}
            for role in ("unet", "autoencoder"):
                if role not in self.spec.networks:
                    continue
                net = networks.build_network(self.spec.networks[role], where=f"networks.{role}")
                check_finite_weights(state[role], role, self.weight_files[role].name)
                _load_state(net, state[role], role, self.load_old)
                built[role] = net.eval().requires_grad_(False)
        except EngineError:
            raise
        except MemoryError as exc:
            raise OutOfMemory(f"not enough memory to load model {self.id!r}; close other programs") from exc
        except RuntimeError as exc:
            if "memory" in str(exc).lower() or "alloc" in str(exc).lower():
                raise OutOfMemory(
                    f"not enough memory to load model {self.id!r} ({one_line(str(exc))[:120]})"
                ) from exc
            from engine.models.copy_check import load_refusal

            raise load_refusal(self, exc) from exc
        return LoadedModel(source=self, unet=built["unet"], autoencoder=built.get("autoencoder"))

    def _read_state_dicts(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for role, path in self.weight_files.items():
            inside(self.path, path, "weights file")
            if not path.is_file():
                raise ModelInvalid(
                    f"model {self.id!r}: weights file {path} is missing; reinstall or re-export the model"
                )
            out[role] = self.read_weights(role, path)
        return out

    def read_weights(self, role: str, path: Path) -> dict[str, Any]:
        """The tensors of the ``role`` network's weights file ``path``, by name, as this kind of folder stores
        them (a safetensors file or a tensors-only torch checkpoint); a kind with its own layout overrides it."""
        if path.suffix == ".safetensors":
            return _read_safetensors(path, role)
        return _read_torch_checkpoint(path)


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


def check_finite_weights(state: dict[str, Any], role: str, file_name: str) -> None:
    """Refuse weights holding NaN or infinity: such a model samples an all-NaN volume. One pass over the
    tensors (a fraction of reading them from disk)."""
    import torch

    for name, tensor in state.items():
        if (
            isinstance(tensor, torch.Tensor)
            and tensor.is_floating_point()
            and not bool(torch.isfinite(tensor).all())
        ):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ModelInvalid(
                f"the {role} weights in {file_name} hold NaN or infinite values ({bad:,} of {tensor.numel():,} "
                f"in {name[:120]}); the file is damaged or was saved from a diverged training run"
            )


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


def open_volsynth_folder(folder: Path) -> ModelSource:
    """Open a VolSynth model folder: the spec is read and checked, nothing else is loaded.

    Raises:
        ModelInvalid: The spec is unreadable, malformed or too large, or a file links out of the folder.
    """
    data = read_json_limited(folder / SPEC_FILE, folder, "spec")
    if not isinstance(data, dict):
        raise ModelInvalid(f"{folder / SPEC_FILE} must hold a JSON object")
    nets = data.get("networks")
    if not isinstance(nets, dict):
        raise ModelInvalid(f"{SPEC_FILE}: 'networks' must be an object of network definitions")
    for role, definition in nets.items():
        if not isinstance(definition, dict):
            raise ModelInvalid(f"{SPEC_FILE}: networks.{role} must be an object with a _target_")
        networks.check_literal(definition, f"networks.{role}")
        networks.network_class_name(definition)
    spec = ModelSpec.from_dict(data)
    weights = folder / WEIGHTS_FILE
    card = folder / CARD_FILE
    for path, what in ((weights, "weights file"), (card, "model card")):
        if path.is_symlink() or path.exists():
            inside(folder, path, what)
    return ModelSource(
        spec=spec,
        path=folder,
        weight_files={role: weights for role in spec.networks},
        card_path=card,
    )


def snake_case(label: str) -> str:
    return re.sub(r"[^0-9a-zA-Z]+", "_", label).strip("_").lower()


__all__ = ["LoadedModel", "ModelSource", "open_volsynth_folder", "sha256_file", "ConditionSpec", "snake_case"]
