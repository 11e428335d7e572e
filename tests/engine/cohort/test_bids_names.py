"""A cohort's image names carry the BIDS suffix of the modality generated (not _T1w for everything)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.cohort.dataset import image_stem, skull_stripped, tissue_paths, volume_path
from engine.errors import InvalidRequest
from engine.nifti.io import tissue_path


@pytest.mark.parametrize(
    ("modality", "stem"),
    [
        (None, "sub-synth0001_T1w"),  # models that name no modality: the demo's T1w
        ("t1w", "sub-synth0001_T1w"),
        ("t2w", "sub-synth0001_T2w"),
        ("flair", "sub-synth0001_FLAIR"),
        ("swi", "sub-synth0001_swi"),
        ("mra", "sub-synth0001_angio"),
        ("mra-skullstripped", "sub-synth0001_desc-skullstripped_angio"),
        ("t2w-skullstripped", "sub-synth0001_desc-skullstripped_T2w"),
        ("FLAIR", "sub-synth0001_FLAIR"),
    ],
)
def test_each_modality_has_its_bids_suffix(modality, stem):
    assert image_stem("sub-synth0001", modality) == stem
    assert volume_path(Path("/c"), "sub-synth0001", modality) == Path(f"/c/sub-synth0001/anat/{stem}.nii.gz")


def test_a_modality_without_a_bids_suffix_is_refused_with_the_known_ones():
    with pytest.raises(InvalidRequest, match=r"no BIDS suffix for modality 'dwi'.*flair, mra, swi, t1w, t2w"):
        image_stem("sub-1", "dwi")


@pytest.mark.parametrize(
    ("suffix", "modality"),
    [("T1w", "t1w"), ("T2w", "t2w"), ("FLAIR", "flair"), ("swi", "swi"), ("angio", "mra")],
)
def test_tissue_maps_take_the_place_of_any_image_suffix(suffix, modality):
    image = Path(f"/c/sub-1/anat/sub-1_{suffix}.nii.gz")
    assert tissue_path(image, "GM").name == "sub-1_label-GM_probseg.nii.gz"
    assert tissue_paths(Path("/c"), "sub-1", ["WM"], modality)[0].name == "sub-1_label-WM_probseg.nii.gz"


@pytest.mark.parametrize(
    ("modality", "stem", "tissue"),
    [
        (None, "sub-1_space-MNI152NLin2009aSym_T1w", "sub-1_space-MNI152NLin2009aSym_label-GM_probseg"),
        (
            "t2w-skullstripped",
            "sub-1_space-MNI152NLin2009aSym_desc-skullstripped_T2w",
            # BIDS entity order: space, label, desc
            "sub-1_space-MNI152NLin2009aSym_label-GM_desc-skullstripped_probseg",
        ),
    ],
)
def test_volumes_in_a_template_space_carry_the_space_entity(modality, stem, tissue):
    space = "MNI152NLin2009aSym"
    assert image_stem("sub-1", modality, space) == stem
    assert volume_path(Path("/c"), "sub-1", modality, space).name == f"{stem}.nii.gz"
    assert tissue_paths(Path("/c"), "sub-1", ["GM"], modality, space)[0].name == f"{tissue}.nii.gz"


@pytest.mark.parametrize(
    ("modality", "description", "stripped"),
    [
        (None, "Latent diffusion model of skull-stripped T1-weighted brain MRI at 2 mm", True),
        (None, "A tiny random model", False),
        ("t1w", "whole head; the -skullstripped modalities are stripped", False),  # the modality decides
        ("flair-skullstripped", "", True),
    ],
)
def test_skull_stripped_follows_the_modality_or_the_model_description(modality, description, stripped):
    assert skull_stripped(modality, description) is stripped
