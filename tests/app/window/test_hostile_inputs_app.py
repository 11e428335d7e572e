"""The app over hostile inputs (issue 18 points 3 and 4): broken model folders in the search path do not
stop it from starting, and opening a hostile file shows one line and leaves the session as it was.

The fixes live in the engine (the registry, ``load_nifti``); these tests check they reach the real window.
"""

from __future__ import annotations

import pytest

from tests.engine.hostile.corpus import build_model_corpus, build_nifti_corpus


@pytest.fixture(scope="module")
def hostile_models(tmp_path_factory, tiny_models_dir):
    root = tmp_path_factory.mktemp("hostile-models")
    secret = root / "passwd"
    secret.write_text("root:x:0:0:root:/root:/bin/bash\n")
    return build_model_corpus(root / "models", tiny_models_dir / "tiny-latent", secret), root / "models"


@pytest.fixture
def registry(hostile_models, tiny_models_dir):
    """Overrides the tiny-model registry: the broken folders come first in the search path."""
    from engine.models.registry import ModelRegistry

    return ModelRegistry([hostile_models[1], tiny_models_dir])


def test_window_starts_with_broken_model_folders_in_the_search_path(main_window, registry):
    window = main_window
    names = [
        window.sampling_panel.model_box.itemText(i) for i in range(window.sampling_panel.model_box.count())
    ]
    # the three tiny models and the one corpus folder whose spec is valid (refused later, at load)
    assert window.sampling_panel.model_box.count() == 4, names
    assert window.state.selected_model is not None
    assert len(registry.broken) >= 15
    assert all("\n" not in b.reason for b in registry.broken)


@pytest.mark.parametrize(
    "case", ["zero-length-axis", "truncated-nii-gz", "gzip-bomb-claims-4gib", "nan-affine", "huge-offset"]
)
def test_opening_a_hostile_file_shows_one_line_and_adds_nothing(
    qtbot, main_window, error_dialogs, tmp_path, case
):
    window = main_window
    path = build_nifti_corpus(tmp_path / "corpus")[case]
    window.open_path(path)  # what `volsynth-studio FILE` and File > Open run
    qtbot.waitUntil(lambda: bool(error_dialogs), timeout=60_000)
    title, message = error_dialogs[-1]
    assert title == "Cannot open file"
    assert path.name in message and "\n" not in message and "Traceback" not in message
    assert len(window.state.volumes) == 0
