"""Models: specs, safe loading of VolSynth folders and MONAI bundles, and the registry."""

from engine.models.registry import DEFAULT_MODEL_ID, ModelRegistry, open_model_folder
from engine.models.source import LoadedModel, ModelSource
from engine.models.spec import ConditionSpec, ModelSpec

__all__ = [
    "DEFAULT_MODEL_ID",
    "ConditionSpec",
    "LoadedModel",
    "ModelRegistry",
    "ModelSource",
    "ModelSpec",
    "open_model_folder",
]
