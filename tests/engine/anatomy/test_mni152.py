"""The shipped MNI152 files and their loaders give what nilearn's loaders give (nilearn is a development
requirement: the product reads resources/mni152 and does not import it)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from engine.anatomy import mni152

nilearn_datasets = pytest.importorskip("nilearn.datasets")

LOADERS = (
    "load_mni152_template",
    "load_mni152_gm_template",
    "load_mni152_wm_template",
    "load_mni152_brain_mask",
)


@pytest.mark.parametrize("kind", sorted(mni152.FILES))
def test_the_shipped_files_are_nilearns(kind):
    from pathlib import Path

    theirs = Path(nilearn_datasets.__file__).parent / "data" / mni152.FILES[kind]
    assert (
        hashlib.sha256(mni152.path(kind).read_bytes()).digest()
        == hashlib.sha256(theirs.read_bytes()).digest()
    )


@pytest.mark.slow
@pytest.mark.parametrize("resolution", [None, 2])
@pytest.mark.parametrize("loader", LOADERS)
def test_the_loaders_match_nilearns(loader, resolution):
    ours = getattr(mni152, loader)(resolution=resolution)
    theirs = getattr(nilearn_datasets, loader)(resolution=resolution)
    assert ours.shape == theirs.shape
    np.testing.assert_allclose(ours.affine, theirs.affine, atol=1e-9)
    np.testing.assert_allclose(ours.get_fdata(), theirs.get_fdata(), atol=1e-6)


def test_the_licence_ships_beside_the_files():
    licence = mni152.path("t1").parent / "LICENSE"
    text = licence.read_text()
    assert (
        "McConnell Brain Imaging Centre" in text
        and "Redistribution and use in source and binary forms" in text
    )
    for kind in mni152.FILES:
        digest = hashlib.sha256(mni152.path(kind).read_bytes()).hexdigest()
        assert digest in text  # the licence names each file it covers by its content
