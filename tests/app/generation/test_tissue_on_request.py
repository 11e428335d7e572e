"""Tissue maps on request for any brain volume in the app: Compute Tissue Maps (tool bar, View menu, Ctrl+Shift+T)
segments the shown volume in the background with a progress bar and a Cancel that stops it, the window stays
usable meanwhile, the tool bar says where the maps came from, refusals are one line in the window, and a vault
scan's computed maps are kept with the item. Driven as a person does, on ``TissueMapsComputer`` and the viewer's
tool bars over ``AppServices`` (tests/app/viewer/rig.py), without the main window."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from PySide6.QtCore import Qt

from app.core.tissue import ALL_TISSUES
from engine.nifti.io import save_volume
from engine.nifti.volume import Volume
from tests.app.runs import generate
from tests.app.viewer.rig import (  # noqa: F401 - a fixture: the tiny tissue model is listed too
    MNI,
    TISSUE_NAMES,
    add_generation,
    build_viewer,
    registry_with_tissue_model,
)
from tests.app.viewer_helpers import pixels
from tests.engine.anatomy.phantoms import phantom, phantom_affine

pytestmark = pytest.mark.render

SEGMENTED = ["GM", "WM", "CSF", "brain"]


def _write(path, data, affine=None, provenance=None):
    return save_volume(
        Volume(
            np.asarray(data, np.float32),
            phantom_affine() if affine is None else affine,
            provenance=provenance or {},
        ),
        path,
    )


@pytest.fixture
def rig(qtbot, app_services):
    """The viewer, its tool bars and Compute Tissue Maps on ``app_services``."""
    return build_viewer(qtbot, app_services)


def _press_compute(qtbot, rig):
    qtbot.keyClick(
        rig.host, Qt.Key.Key_T, Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    )  # Ctrl+Shift+T


def _wait_done(qtbot, rig, timeout=300_000):
    # A bound for a job that never ends, not a speed check: a segmentation took over 60 s on 2 busy cores.
    qtbot.waitUntil(
        lambda: rig.tissue_maps.job is None and not rig.runner.running("tissue-maps"), timeout=timeout
    )


@pytest.mark.slow
def test_compute_tissue_maps_of_an_opened_nifti_shows_them_and_says_how_made(qtbot, rig, tmp_path):
    bar, computer = rig.tissue_toolbar, rig.tissue_maps
    entry = rig.open(qtbot, _write(tmp_path / "sub-01_T2w.nii.gz", phantom("t2w")))
    # No maps yet: the overlay is off and disabled, Compute is offered (tool bar, View menu, Help's shortcut).
    assert entry.tissue == {} and not bar.tissue_action.isEnabled()
    assert (
        computer.compute_action.isEnabled() and computer.compute_action in rig.services.menus.view.actions()
    )
    assert "Ctrl+Shift+T" in computer.compute_action.toolTip()
    assert not computer.progress_item.isVisible() and not computer.source_item.isVisible()
    qtbot.waitUntil(lambda: rig.viewer.axial.draw_count > 0, timeout=10_000)
    plain = pixels(rig.viewer.axial)

    values = []
    computer.progress_bar.valueChanged.connect(values.append)
    _press_compute(qtbot, rig)
    assert computer.job is not None and computer.progress_item.isVisible()
    assert not computer.compute_action.isEnabled() and computer.strip.cancel_button.isEnabled()
    _wait_done(qtbot, rig)

    # The maps came with the contrast the file's name says (T2w), the overlay is on, the bar says how made.
    assert entry.tissue_names == SEGMENTED and all(m.shape == entry.shape for m in entry.tissue.values())
    made = entry.provenance["tissue_maps_made"]
    assert made["tissue_maps_source"] == "method" and made["contrast"] == "t2w"
    # the bar moved forward to the end
    assert values and values == sorted(values) and values[-1] == computer.progress_bar.maximum()
    assert rig.state.show_tissue and rig.state.tissue_shown() == ALL_TISSUES
    assert bar.tissue_action.isEnabled() and not computer.progress_item.isVisible()
    from engine import __version__

    assert computer.source_item.isVisible()
    assert computer.source_label.text() == f"Maps segmented: VolSynth EM {__version__}, T2w"
    assert f"segmented: VolSynth EM {__version__}, T2w" in rig.message()
    assert "tissue maps: GM, WM, CSF, brain" in rig.session_panel.details.text()
    assert not np.array_equal(pixels(rig.viewer.axial), plain)
    # The brain mask holds the classes: it is a map of its own, not a class of the label map.
    assert "brain" not in bar.legend_label.text() and bar.tissue_box.findData("brain") > 0


@pytest.mark.slow
def test_an_unknown_contrast_is_segmented_as_t1w_with_a_visible_note_and_the_menu_sets_it(
    qtbot, rig, tmp_path
):
    computer = rig.tissue_maps
    entry = rig.open(qtbot, _write(tmp_path / "head.nii.gz", phantom("t1w")))
    assert computer.contrast_menu.menuAction() in rig.services.menus.view.actions()
    computer.compute_action.trigger()  # (View > Compute Tissue Maps)
    _wait_done(qtbot, rig)
    assert entry.provenance["tissue_maps_made"]["contrast"] == "t1w"
    assert "contrast not known: segmented as T1w" in computer.source_label.text()

    # Told it is FLAIR, the same volume is refused in one line saying what it looks like; its maps stay.
    flair = next(a for a in computer.contrast_group.actions() if a.data() == "flair")
    flair.trigger()
    computer.compute_action.trigger()  # segmented maps may be made again
    _wait_done(qtbot, rig)
    message = rig.message()
    assert (
        "looks like T1w" in message and "View \u203a Tissue Map Contrast" in message and "--" not in message
    )
    assert entry.tissue_names == SEGMENTED and computer.source_label.text().startswith("Maps segmented")


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("sub-01_swi.nii.gz", None, "SWI shows susceptibility"),
        ("sub-01_angio.nii.gz", None, "MRA (angiography) shows flowing blood"),
        ("slab.nii.gz", "slab", "too small for tissue maps"),
        ("noise.nii.gz", "noise", "does not look like a brain MRI"),
    ],
)
def test_refusals_are_one_line_in_the_window(qtbot, rig, error_dialogs, tmp_path, name, data, reason):
    computer = rig.tissue_maps
    rng = np.random.default_rng(0)
    volume = {
        None: phantom("t1w"),
        "slab": rng.random((64, 64, 3)),  # a single-slice-thick image: no 3D volume to segment
        "noise": rng.random((48, 48, 48)),  # what random weights make
    }[data]
    entry = rig.open(qtbot, _write(tmp_path / name, volume, np.diag([2.0, 2.0, 2.0, 1.0])))
    _press_compute(qtbot, rig)
    _wait_done(qtbot, rig)
    text = computer.source_label.text()
    assert text.startswith("No tissue maps: ") and reason in text and "\n" not in text
    assert "Traceback" not in text and reason in rig.message()
    assert computer.source_item.isVisible() and entry.tissue == {} and error_dialogs == []
    assert computer.compute_action.isEnabled()  # it may be tried again (another contrast)


@pytest.mark.slow
def test_the_window_stays_usable_while_it_runs_and_cancel_stops_it(qtbot, rig, tmp_path, monkeypatch):
    import engine.anatomy.segment as segment

    computer = rig.tissue_maps
    other = rig.open(qtbot, _write(tmp_path / "b_T1w.nii.gz", phantom("t1w", seed=2)))
    first = rig.open(qtbot, _write(tmp_path / "a_T1w.nii.gz", phantom("t1w", seed=1)))
    # Hold the work inside its placing of the priors until the test lets it go (the worker thread waits).
    inside, release, stages = threading.Event(), threading.Event(), []
    real_place, real_em = segment._place_priors, segment._em

    def held_place(*args, **kwargs):
        inside.set()
        release.wait(30)
        return real_place(*args, **kwargs)

    def counted_em(*args, **kwargs):
        stages.append("fit")
        return real_em(*args, **kwargs)

    monkeypatch.setattr(segment, "_place_priors", held_place)
    monkeypatch.setattr(segment, "_em", counted_em)
    _press_compute(qtbot, rig)
    qtbot.waitUntil(inside.is_set, timeout=30_000)

    # While it runs: the other volume is shown (picked in the session list with the keyboard), the slices answer.
    assert computer.job is not None
    session_list = rig.session_panel.list
    session_list.setFocus()
    qtbot.waitUntil(session_list.hasFocus, timeout=5_000)
    qtbot.keyClick(session_list, Qt.Key.Key_Up)
    assert rig.state.shown is other and computer.job is not None
    slice_before = rig.state.crosshair_voxel()[2]
    qtbot.keyClick(rig.viewer.axial, Qt.Key.Key_Up)
    assert rig.state.crosshair_voxel()[2] == slice_before + 1
    assert computer.progress_item.isVisible()

    # Cancel from the keyboard: the tool bar's Cancel has the focus, Space presses it.
    cancel = computer.strip.cancel_button
    qtbot.waitUntil(cancel.isVisible, timeout=5_000)  # shown with the next layout of the tool bar
    cancel.setFocus()
    qtbot.keyClick(cancel, Qt.Key.Key_Space)
    assert computer.progress_bar.format().endswith("Cancelling\u2026") and not cancel.isEnabled()
    release.set()
    _wait_done(qtbot, rig)
    # Stopped before the fit, nothing was given to the volume, and it can be asked for again.
    assert stages == [] and first.tissue == {} and "tissue_maps_made" not in first.provenance
    assert "cancelled" in rig.message()
    assert not computer.progress_item.isVisible() and computer.compute_action.isEnabled()


def _right_click_row(qtbot, browser, item_id):
    from PySide6.QtGui import QContextMenuEvent
    from PySide6.QtWidgets import QApplication

    browser.select_item(item_id)
    rect = browser.table.visualItemRect(browser.table.item(browser.table.currentRow(), 0))
    viewport = browser.table.viewport()
    QApplication.sendEvent(
        viewport,
        QContextMenuEvent(QContextMenuEvent.Reason.Mouse, rect.center(), viewport.mapToGlobal(rect.center())),
    )
    qtbot.waitUntil(lambda: browser.table_menu is not None and browser.table_menu.isVisible(), timeout=5_000)


@pytest.mark.slow
def test_a_vault_scan_is_segmented_from_the_browser_and_keeps_its_maps_encrypted(
    qtbot, rig, tmp_path, monkeypatch, error_dialogs
):
    from app.vault import install_vault
    from engine.vault import KdfParams, Vault
    from tests.engine.anatomy.phantoms import phantom_labels

    monkeypatch.setenv("VOLSYNTH_ANCHOR_DIR", str(tmp_path / "anchors"))
    passphrase = "correct horse battery staple"
    # A scan stored as a scanner writes it (left-right and front-back flipped: LPS), so the maps must be put
    # back on the stored grid, not the RAS+ one the viewer shows.
    flip = np.diag([-1.0, -1.0, 1.0, 1.0])
    stored_affine = phantom_affine() @ flip
    stored_affine[:3, 3] = phantom_affine()[:3, :3] @ (np.array([51, 59, 0]) * 1.0) + phantom_affine()[:3, 3]
    image = phantom("t1w")[::-1, ::-1, :]
    path = save_volume(Volume(np.ascontiguousarray(image), stored_affine), tmp_path / "scan.nii.gz")
    vault = Vault.create(
        tmp_path / "vault", passphrase, kdf=KdfParams(memory_kib=1024, iterations=1, lanes=1)
    )
    scan = vault.import_nifti(path, kind="scan", patient={"name": "Doe^Jane"})
    vault.lock()

    controller = install_vault(rig.services, rig.session_panel.list, lambda: None)
    controller.locking.set_vault_path(tmp_path / "vault")
    dialog = controller.locking.request_unlock()
    dialog.passphrase_edit.setText(passphrase)
    with qtbot.waitSignal(
        controller.task_ended, timeout=30_000, check_params_cb=lambda name, _: name == "unlock"
    ):
        dialog.ok_button.click()
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == 1, timeout=10_000)

    _right_click_row(qtbot, controller.browser, scan.id)
    action = next(a for a in controller.browser.table_menu.actions() if a.text() == "Compute Tissue Maps")
    with qtbot.waitSignal(
        controller.task_ended, timeout=60_000, check_params_cb=lambda name, _: name == "tissue"
    ) as ended:
        action.trigger()
        controller.browser.table_menu.close()
    assert ended.args[1] == "finished" and error_dialogs == []
    assert "kept with it in the vault, encrypted (segmented: VolSynth EM" in rig.message()
    qtbot.waitUntil(lambda: controller.listing.item(scan.id).tissue_maps != (), timeout=10_000)
    assert set(controller.listing.item(scan.id).tissue_maps) == set(SEGMENTED)

    # Opened, the scan comes with its maps on the viewer's grid, where the phantom's grey matter is.
    with qtbot.waitSignal(rig.services.volume_opened, timeout=20_000) as opened:
        controller.opening.open_item(scan.id)
    entry = opened.args[0]
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)
    assert entry.tissue_names == SEGMENTED
    gm, truth = entry.tissue["GM"] > 0.5, phantom_labels() == 2
    assert 2 * (gm & truth).sum() / (gm.sum() + truth.sum()) > 0.7  # reoriented back and forth correctly
    assert rig.tissue_maps.source_label.text().startswith("Maps segmented: VolSynth EM")
    assert rig.tissue_maps.source_label.text().endswith("T1w")
    controller.locking.lock()


@pytest.mark.slow
def test_a_models_own_maps_say_so_and_are_not_computed_again(qtbot, rig):
    """A real run of a model with tissue channels (the tiny tissue model): its maps and space come with the
    volume, the run's message says so with the key that overlays them, and they are not computed again."""
    rig = add_generation(qtbot, rig)
    state, computer = rig.state, rig.tissue_maps
    state.select_model(state.model_by_id("tiny-tissue"))
    assert generate(qtbot, rig, steps=2, click=True) == "finished"
    entry = state.shown
    assert entry.tissue_names == TISSUE_NAMES and entry.space == MNI
    assert all(m.shape == entry.shape and m.min() >= 0 and m.max() <= 1 for m in entry.tissue.values())
    message = (
        rig.message()
    )  # the longest message there is (the window's status bar at 1024x700: test_viewer.py)
    assert message.startswith("Generated 1 volume with tissue maps") and "Ctrl+T overlays them" in message
    assert computer.source_label.text() == "Maps from the model's channels"
    assert not computer.compute_action.isEnabled()
    assert "its model's own tissue maps" in computer.compute_action.toolTip()
    _press_compute(qtbot, rig)  # the shortcut does nothing then
    assert computer.job is None and entry.tissue_names == TISSUE_NAMES
