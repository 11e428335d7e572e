"""The models a user can pick: shipped ones in ``resources/models`` plus folders the user added.

Search path, first match wins for a given id: ``$VOLSYNTH_MODEL_PATH`` (``os.pathsep``-separated), the
user's model folder (``~/.local/share/volsynth/models``), then the shipped models.
"""

from __future__ import annotations

import os
from pathlib import Path

from engine.errors import EngineError, ModelInvalid, ModelNotFound
from engine.models.bundle import open_bundle
from engine.models.source import SPEC_FILE, ModelSource, open_volsynth_folder
from engine.resources import resource_path

DEFAULT_MODEL_ID = "brain-t1-demo"


def open_model_folder(path: str | Path) -> ModelSource:
    """Open a VolSynth model folder or a MONAI bundle folder (detected by its layout)."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ModelNotFound(
            f"no model folder at {folder}; give a model id from `volsynth models` or a folder path"
        )
    if (folder / SPEC_FILE).is_file():
        return open_volsynth_folder(folder)
    if (folder / "configs" / "inference.json").is_file():
        return open_bundle(folder)
    raise ModelInvalid(
        f"{folder} is neither a VolSynth model folder (spec.json) nor a MONAI bundle (configs/inference.json)"
    )


def user_models_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "volsynth" / "models"


def default_search_path() -> list[Path]:
    paths = [Path(p) for p in os.environ.get("VOLSYNTH_MODEL_PATH", "").split(os.pathsep) if p]
    return [*paths, user_models_dir(), resource_path("models")]


class ModelRegistry:
    """Finds models by id or path. Listing reads only JSON, so it is fast and needs no torch."""

    def __init__(self, search_path: list[Path] | None = None):
        self.search_path = list(search_path) if search_path is not None else default_search_path()
        self.problems: dict[Path, str] = {}  # folders that looked like models but could not be opened

    def list(self) -> list[ModelSource]:
        found: dict[str, ModelSource] = {}
        self.problems.clear()
        for root in self.search_path:
            if not root.is_dir():
                continue
            for folder in sorted(p for p in root.iterdir() if p.is_dir()):
                try:
                    source = open_model_folder(folder)
                except EngineError as exc:
                    self.problems[folder] = str(exc)
                    continue
                found.setdefault(source.id, source)
        return list(found.values())

    def get(self, model: str | Path | None = None) -> ModelSource:
        """Resolve a model id or folder path; ``None`` means the default (shipped) model."""
        if model is None or model == "":
            model = DEFAULT_MODEL_ID
        text = str(model)
        looks_like_path = os.sep in text or text.startswith((".", "~")) or Path(text).expanduser().is_dir()
        if looks_like_path:
            return open_model_folder(text)
        for source in self.list():
            if source.id == text:
                return source
        known = ", ".join(s.id for s in self.list()) or "none installed"
        raise ModelNotFound(
            f"unknown model {text!r}; available: {known}. Use `volsynth models` to list them "
            "or pass a model folder path"
        )
