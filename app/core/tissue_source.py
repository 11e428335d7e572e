"""Tissue maps made on request for any brain volume of the session: which contrast it is segmented as, where
a volume's maps came from (for the overlay to say), and the segmentation itself for a session volume (a vault
item's runs it in ``app.core.vault_items.segment_vault_item``). Qt-free: the tissue toolbar's computer runs these in the app's one worker, the tests call them.

Why an unknown contrast is segmented as T1w rather than asked for first: T1w is the contrast of nearly every
structural brain MRI (and of the generative models this app runs), so it is what a radiologist expects to be
assumed; the method checks the tissue order against the template before it fits anything and refuses a
volume that runs against T1w in one line naming the contrast it looks like, so the default never gives wrong
maps silently. The note says it was assumed, and View > Tissue Map Contrast sets it by hand.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine.anatomy.segment import CONTRAST_LABELS, TissueMaps, check_contrast, contrast_from_modality

AUTO = "auto"
#: The choices of View > Tissue Map Contrast: automatic (from the volume), or one the user names.
CONTRAST_CHOICES = (AUTO, "t1w", "t2w", "flair")
CONTRAST_CHOICE_TITLES = {AUTO: "Automatic (from the volume)", **CONTRAST_LABELS}
#: The progress line of each stage ``segment`` reports.
STAGE_TEXT = {
    "mask": "Finding the brain",
    "priors": "Placing the MNI152 priors",
    "fit": "Fitting GM, WM and CSF",
    "maps": "Making the maps",
    "done": "Done",
}
# A BIDS suffix in a file name (sub-01_T2w.nii.gz, brain_FLAIR.nii): the contrast the file says it is.
_BIDS_SUFFIX = re.compile(r"_(T1w|T2w|FLAIR|T2starw|SWI|swi|angio|MRA|dwi|CT|ct)(?:[._]|$)")
_SUFFIX_CONTRAST = {"angio": "mra", "t2starw": "swi"}

Report = Callable[[float | None, str], None]


def contrast_for(provenance: dict, names: list[str], choice: str = AUTO) -> tuple[str, str]:
    """``(contrast, note)`` a volume is segmented as.

    Args:
        provenance: The volume's provenance (its sidecar's): a generation's ``output.modality`` names it.
        names: File names that may carry a BIDS suffix (the file it was opened from, a vault item's original
            name), most telling first.
        choice: View > Tissue Map Contrast: ``auto`` or a contrast the user named.

    Returns:
        The contrast for ``segment`` and a note for people: empty when the volume or the user said it.

    Raises:
        InvalidRequest: The volume says it is a contrast that cannot be segmented (SWI, MRA...), with why.
    """
    if choice != AUTO:
        return check_contrast(choice), ""
    modality = (provenance.get("output") or {}).get("modality") or provenance.get("modality")
    if isinstance(modality, str) and modality.strip():
        return contrast_from_modality(modality), ""
    made = provenance.get("tissue_maps_made")
    if isinstance(made, dict) and isinstance(made.get("contrast"), str):
        return check_contrast(made["contrast"]), ""  # segmented before as this: the same again
    for name in names:
        match = _BIDS_SUFFIX.search(Path(str(name)).name)
        if match:
            key = match.group(1).lower()
            return check_contrast(_SUFFIX_CONTRAST.get(key, key)), ""
    return "t1w", "contrast not known: segmented as T1w (View \u203a Tissue Map Contrast sets it)"


def maps_source_text(provenance: dict, kind: str, from_vault: bool = False) -> str:
    """Where a volume's tissue maps came from, in a few words: ``from the model's channels`` or
    ``segmented: VolSynth EM 0.1.0, T1w`` (from the record of how they were made), else what is known."""
    made = provenance.get("tissue_maps_made")
    if isinstance(made, dict):
        if made.get("tissue_maps_source") == "model channels":
            return "from the model's channels"
        if made.get("tissue_maps_source") == "method":
            version = made.get("volsynth_version") or (made.get("library_versions") or {}).get("volsynth", "")
            contrast = CONTRAST_LABELS.get(str(made.get("contrast", "")).lower(), made.get("contrast", "?"))
            return f"segmented: VolSynth EM {version}, {contrast}".replace("EM ,", "EM,")
    if kind == "generated":  # a run of this session: its maps are the ones the model decoded
        return "from the model's channels"
    if from_vault:
        return "stored with the vault item"
    return "from the files beside it"


def made_record(made: TissueMaps) -> dict:
    """How the maps were made (``TissueMaps.sidecar()``) plus the VolSynth version that made them."""
    from engine import __version__

    return {**made.sidecar(), "volsynth_version": __version__}


def segment_session_volume(data: np.ndarray, affine: np.ndarray, contrast: str, report: Report):
    """Tissue maps of a session volume (RAS+, as the viewer holds it): ``(maps, record of how made)``.

    ``report(fraction, text)`` gets the stages; when it raises (the worker's cancel) the work stops there.
    Raises InvalidRequest with the reason when the volume is refused (SWI, noise, not brain-like...)."""
    from engine.anatomy.segment import segment

    def on_stage(stage: str, fraction: float) -> None:
        report(fraction, STAGE_TEXT.get(stage, stage))

    report(0.0, STAGE_TEXT["mask"])
    made = segment(data, affine, contrast, on_stage=on_stage)
    return made.maps, made_record(made)


def segment_and_check(data: np.ndarray, affine: np.ndarray, space: str | None, contrast: str, report: Report):
    """``segment_session_volume`` and the anatomy check of the maps it made: ``(maps, record of how made, check
    record)``; the check goes into the volume's provenance (``anatomy_check``), as ``volsynth segment`` writes it,
    so wherever the maps are shown their verdict is known."""
    from engine.anatomy.checks import check_maps

    maps, made = segment_session_volume(data, affine, contrast, report)
    report(1.0, "Checking the anatomy")
    check = check_maps(dict(maps), affine, space=space, maps_from=str(made.get("method", "segmentation")))
    return maps, made, check.to_dict()
