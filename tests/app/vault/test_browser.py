"""The vault browser (app/vault/browser.py): rows that read like a worklist, Enter on a row opens it, the date
column's sort arrow, and the browser docked beside the viewer (real vaults in tmp_path, no main window)."""

from __future__ import annotations

import math
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from PySide6.QtCore import QPoint, Qt

from engine.vault import Vault
from tests.app.vault.helpers import (
    PASSPHRASE,
    create_via_dialog,
    generated_entry,
    import_items,
    install_viewer,
    open_item,
    wait_task,
)

render = pytest.mark.render


def test_table_cells_read_like_a_worklist():
    from app.core.vault_items import item_row, jsonable, label_problems, person_name

    assert person_name("Doe^Jane^Q") == "Doe, Jane Q" and person_name("Anonymous") == "Anonymous"

    class Info:
        id, kind, label, created, source = "ab" * 16, "scan", "T1", "2024-05-02T10:00:00+00:00", "dicom"
        patient, study, provenance = (
            {"name": "Doe^Jane"},
            {"date": "20240131", "modality": "MR", "description": "Brain"},
            None,
        )

    assert item_row(Info) == ("Doe, Jane", "MR \u00b7 Brain", "2024-01-31", "Scan", "T1")
    Info.kind, Info.patient, Info.study = "synthetic", {}, {}
    Info.provenance = {"model": {"id": "brain-t1-demo"}, "seed": 7}
    assert (
        item_row(Info)[:2] == ("\u2014", "brain-t1-demo \u00b7 seed 7") and item_row(Info)[3] == "Synthetic"
    )
    assert jsonable({"a": (1, np.float32(0.5)), "b": math.nan, 3: Path("/x")}) == {
        "a": [1, 0.5],
        "b": None,
        "3": "/x",
    }
    assert label_problems([f"item {'ab' * 16} is corrupted"], [Info]) == [
        f"\u201cT1\u201d: item {'ab' * 16} is corrupted"
    ]


@render
def test_create_import_list_and_open_keeps_the_data(qtbot, vault_app, nibabel_data, error_dialogs):
    from engine.nifti.io import load_nifti

    app, controller = vault_app, vault_app.controller
    assert not controller.session.is_unlocked and "Vault" in [
        a.text().replace("&", "") for a in app.services.menus.menu_bar.actions()
    ]

    # the create dialog refuses a mismatched confirmation before anything is written
    dialog = controller.locking.request_unlock()
    dialog.passphrase_edit.setText(PASSPHRASE)
    dialog.confirm_edit.setText(PASSPHRASE + "x")
    dialog.ok_button.click()
    assert dialog.isVisible() and "differ" in dialog.error_label.text()
    assert not Vault.exists(controller.session.path)
    dialog.reject()

    create_via_dialog(qtbot, controller)
    browser = controller.browser
    assert Vault.exists(controller.session.path) and app.dock.isVisible()
    assert browser.pages.currentWidget() is browser.unlocked_page
    qtbot.waitUntil(lambda: browser.table_stack.currentWidget() is browser.empty_label)

    source = nibabel_data / "anatomical.nii"
    import_items(
        qtbot,
        controller,
        [source],
        rows=1,
        patient={"name": "Doe^Jane", "id": "P-001"},
        study={"description": "MR brain", "date": "20240131"},
    )
    assert browser.row_texts() == [("Doe, Jane", "MR brain", "2024-01-31", "Scan", "anatomical")]
    info = controller.listing.items[0]
    assert info.kind == "scan" and info.label == "anatomical"

    browser.select_item(info.id)
    assert browser.open_button.isEnabled()
    # Enter on the selected row opens it, as a double-click does (a worklist read with the keyboard).
    with qtbot.waitSignal(app.volume_opened, timeout=20_000) as blocker:
        qtbot.keyClick(browser.table, Qt.Key.Key_Return)
    entry = blocker.args[0]
    qtbot.waitUntil(lambda: not controller.tasks.running, timeout=10_000)
    from_disk = load_nifti(source)  # what File > Open shows for the same file
    assert app.state.shown is entry and entry.name == "anatomical" and not entry.synthetic
    assert entry.data.dtype == np.float32 and np.array_equal(entry.data, from_disk.data)
    assert np.allclose(entry.affine, from_disk.affine)
    assert entry.path is None  # decrypted into memory only
    assert controller.opening.entry_is_from_vault(entry) and not controller.saving.can_save(entry)
    assert app.session_panel.list.count() == 1
    assert not error_dialogs

    app.host.close()  # closing the app's window locks the vault
    assert not controller.session.vault.is_unlocked and not controller.session.is_unlocked


def _sort_arrow(header, column: int) -> str:
    """Which way the sort arrow drawn in a header section points ("up" or "down"), read from its pixels.

    The arrow is the right-most mark in the section, apart from the label; a down arrow (\u25bc) is widest in
    its top row, an up arrow (\u25b2) in its bottom row.
    """
    image = header.grab().toImage()
    left = header.sectionViewportPosition(column)
    right = left + header.sectionSize(column)
    background = image.pixelColor(left + 1, 1).lightness()
    marked = {
        (x, y)
        for x in range(left, right)
        for y in range(image.height())
        if abs(image.pixelColor(x, y).lightness() - background) > 40
    }
    columns = sorted({x for x, _ in marked})
    arrow = [columns[-1]]
    for x in reversed(columns[:-1]):  # walk left from the right-most mark until a gap
        if arrow[-1] - x > 2:
            break
        arrow.append(x)
    rows: dict[int, int] = {}
    for x, y in marked:
        if x in arrow:
            rows[y] = rows.get(y, 0) + 1
    top, bottom = rows[min(rows)], rows[max(rows)]
    assert top != bottom, rows
    return "down" if top > bottom else "up"


@render
def test_date_column_sort_arrow_matches_the_order_and_a_click_flips_both(
    qtbot, vault_app, tmp_path, screenshot
):
    app, controller = vault_app, vault_app.controller
    create_via_dialog(qtbot, controller)
    rng = np.random.default_rng(0)
    for n, date in enumerate(("20220301", "20240131")):
        path = tmp_path / f"scan{n}.nii.gz"
        nib.save(nib.Nifti1Image(rng.random((8, 8, 8), dtype=np.float32), np.eye(4)), str(path))
        import_items(qtbot, controller, [path], rows=n + 1, study={"date": date})
    table = controller.browser.table
    header = table.horizontalHeader()
    app.dock.show()
    app.dock.raise_()
    qtbot.waitExposed(table)

    def dates() -> list[str]:
        return [table.item(row, 2).text() for row in range(table.rowCount())]

    newest_first = dates()
    assert newest_first == sorted(newest_first, reverse=True) and newest_first[0] != newest_first[1]
    assert header.sortIndicatorSection() == 2 and header.sortIndicatorOrder() == Qt.SortOrder.DescendingOrder
    assert _sort_arrow(header, 2) == "down"  # it was drawn pointing up (ascending) over newest-first rows
    screenshot(app.host, "14-vault-date-sort-newest-first")

    date_x = header.sectionViewportPosition(2) + header.sectionSize(2) // 2
    qtbot.mouseClick(header.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(date_x, header.height() // 2))
    assert dates() == newest_first[::-1]  # oldest first now
    assert header.sortIndicatorOrder() == Qt.SortOrder.AscendingOrder and _sort_arrow(header, 2) == "up"
    qtbot.mouseClick(header.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(date_x, header.height() // 2))
    assert dates() == newest_first
    assert header.sortIndicatorOrder() == Qt.SortOrder.DescendingOrder and _sort_arrow(header, 2) == "down"


@pytest.mark.slow
@render
def test_screenshot_vault_browser(qtbot, vault_app, nibabel_data, mni_t1, screenshot):
    """The browser docked under the viewer with a scan, a DICOM series, a generated volume and a real T1 in
    it, the T1 open (a picture for people; the generated volume is marked saved once in the vault)."""
    from pydicom.data import get_testdata_file

    from app.core.vault_items import ImportJob

    app, controller = vault_app, vault_app.controller
    install_viewer(app.services)
    app.host.resize(1500, 920)
    create_via_dialog(qtbot, controller)
    import_items(
        qtbot,
        controller,
        [nibabel_data / "anatomical.nii"],
        rows=1,
        label="SPM normalised T1",
        patient={"name": "Roe^Richard", "id": "P-0107"},
        study={"description": "MR brain", "date": "20231105"},
    )
    controller.importing.import_sources(
        [ImportJob(Path(get_testdata_file("MR_small.dcm")), "dicom", label="T2 axial")]
    )
    assert wait_task(qtbot, controller, "import") == "finished"
    generated = generated_entry(app.state, seed=20240131)
    assert not generated.saved
    controller.saving.save_entry()
    assert wait_task(qtbot, controller, "save") == "finished"
    assert generated.saved  # in the vault now: crash recovery lets it go at a clean exit
    import_items(
        qtbot,
        controller,
        [mni_t1],
        rows=4,
        label="T1 MPRAGE",
        patient={"name": "Doe^Jane", "id": "P-0042"},
        study={"description": "MR brain follow-up", "date": "20240131"},
    )
    mni = next(i for i in controller.listing.items if i.label == "T1 MPRAGE")
    open_item(qtbot, controller, mni.id)
    controller.browser.select_item(mni.id)
    app.dock.raise_()
    # one auto-lock tick for the footer
    with qtbot.waitSignal(controller.auto_lock_tick, timeout=5_000):
        pass
    path = screenshot(app.host, "07-vault-browser")
    assert path.is_file() and path.stat().st_size > 10_000
