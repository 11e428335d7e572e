"""The models a user can pick: shipped ones in ``resources/models`` plus folders the user added.

Search path, first match wins for a given id: ``$VOLSYNTH_MODEL_PATH`` (``os.pathsep``-separated), the
user's model folder (``~/.local/share/volsynth/models``), then the shipped models.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from engine.errors import EngineError, ModelInvalid, ModelNotFound
from engine.files.shipped import resource_path
from engine.models.bundle import open_bundle
from engine.models.maisi import looks_like_maisi, open_maisi_folder
from engine.models.source import SPEC_FILE, ModelSource, open_volsynth_folder
from engine.models.spec import one_line

DEFAULT_MODEL_ID = "brain-t1-demo"


@dataclass(frozen=True)
class BrokenModel:
    """A folder in the model search path that could not be opened, and why (one line)."""

    path: Path
    reason: str

    @property
    def name(self) -> str:
        return self.path.name


def _open(folder: Path) -> ModelSource:
    if (folder / SPEC_FILE).is_file() or (folder / SPEC_FILE).is_symlink():
        return open_volsynth_folder(folder)
    if (folder / "configs" / "inference.json").is_file():
        return open_bundle(folder)
    if looks_like_maisi(folder):
        return open_maisi_folder(folder)
    raise ModelInvalid(
        f"{folder} is neither a VolSynth model folder (spec.json), a MONAI bundle (configs/inference.json) "
        "nor NVIDIA's NV-Generate-MR-Brain (configs/config_maisi_diff_model_rflow-mr-brain.json)"
    )


def open_model_folder(path: str | Path) -> ModelSource:
    """Open a VolSynth model folder or a MONAI bundle folder (detected by its layout).

    Whatever is wrong with the folder ends as one ModelInvalid line: a model folder is untrusted input and
    must never crash the CLI or the app with a traceback.
    """
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise ModelNotFound(
            f"no model folder at {folder}; give a model id from `volsynth models` or a folder path"
        )
    try:
        return _open(folder)
    except EngineError as exc:
        if "\n" in str(exc):
            raise type(exc)(one_line(str(exc))) from None
        raise
    except RecursionError:
        raise ModelInvalid(f"{folder.name}: its JSON nests too deeply to be a model spec") from None
    except Exception as exc:  # noqa: BLE001 - the last line of defence for malformed folders
        detail = one_line(str(exc))[:200] or type(exc).__name__
        raise ModelInvalid(
            f"{folder.name} is not a usable model folder ({type(exc).__name__}: {detail})"
        ) from None


def user_models_dir() -> Path:
    from engine.files.user_folders import user_data_dir

    return user_data_dir() / "models"


def default_search_path() -> list[Path]:
    paths = [Path(p) for p in os.environ.get("VOLSYNTH_MODEL_PATH", "").split(os.pathsep) if p]
    return [*paths, user_models_dir(), resource_path("models")]


class ModelRegistry:
    """Finds models by id or path. Listing reads only JSON, so it is fast and needs no torch."""

    def __init__(self, search_path: list[Path] | None = None):
        self.search_path = list(search_path) if search_path is not None else default_search_path()
        self.problems: dict[Path, str] = {}  # folders that looked like models but could not be opened

    @property
    def broken(self) -> list[BrokenModel]:
        """The folders the last :meth:`list` could not open, each with its reason (for the app's list)."""
        return [BrokenModel(path, reason) for path, reason in self.problems.items()]

    def list(self) -> list[ModelSource]:
        """Every model in the search path, first match per id. Never raises for a bad folder: each one
        is recorded in :attr:`problems` / :attr:`broken` instead, so one bad folder cannot stop the CLI
        or the app from starting."""
        found: dict[str, ModelSource] = {}
        self.problems.clear()
        for root in self.search_path:
            try:
                if not root.is_dir():
                    continue
                folders = sorted(p for p in root.iterdir() if p.is_dir())
            except OSError as exc:
                self.problems[root] = f"cannot list the folder: {exc.strerror or exc}"
                continue
            for folder in folders:
                try:
                    source = open_model_folder(folder)
                except EngineError as exc:
                    self.problems[folder] = one_line(str(exc))
                    continue
                except Exception as exc:  # noqa: BLE001 - never let one folder stop the listing
                    self.problems[folder] = f"{type(exc).__name__}: {one_line(str(exc))[:200]}"
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
        sources = self.list()
        for source in sources:
            if source.id == text:
                return source
        for folder, problem in self.problems.items():
            if folder.name == text:
                raise ModelInvalid(f"model folder {folder} cannot be used: {problem}")
        known = ", ".join(s.id for s in sources) or "none installed"
        raise ModelNotFound(
            f"unknown model {text!r}; available: {known}. Use `volsynth models` to list them "
            "or pass a model folder path"
        )
