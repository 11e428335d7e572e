"""The contrasts whose quality a model's owners do not guarantee, from the catalogue, for the modality picker.

NVIDIA does not guarantee NV-Generate-MR-Brain's MRA (any plane) or SWI sagittal and coronal (very few
training scans); ``resources/catalogue/catalogue.json`` records it per modality, and ``volsynth models``
lists the same caveats under an installed model's ``--modality`` choices.
"""

from __future__ import annotations

from engine.errors import EngineError
from engine.models.catalogue import load_catalogue

# The catalogue's layout for each model source the loader knows (a MONAI bundle or VolSynth folder has none).
_LAYOUTS = {"nv-generate": "nv-generate"}


def not_guaranteed(spec) -> dict[str, str]:
    """{modality name: the planes not guaranteed ('sagittal and coronal', 'all planes')} for ``spec``.

    Only the modalities the model offers; empty for a model the catalogue does not describe, or when the
    catalogue cannot be read (a note is then missing, nothing else changes).
    """
    layout = _LAYOUTS.get(getattr(spec, "source", ""))
    offered = set(getattr(spec, "modality_names", ()) or ())
    if not layout or not offered:
        return {}
    try:
        entry = next((e for e in load_catalogue() if e.layout == layout), None)
    except EngineError:
        return {}
    if entry is None:
        return {}
    return {
        m["name"]: str(m["not_guaranteed"])
        for m in entry.makes.get("modalities", [])
        if m.get("not_guaranteed") and m.get("name") in offered
    }


def caveat_text(planes: str) -> str:
    """The note under the picker: 'Quality not guaranteed by the model's owners (sagittal and coronal)'."""
    return f"Quality not guaranteed by the model's owners ({planes}): few training scans"
