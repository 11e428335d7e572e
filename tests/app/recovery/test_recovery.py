"""Crash recovery: generated volumes survive a killed app and come back at the next start."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt

from app.core.recovery import RecoveryStore
from engine.nifti.volume import Volume
from tests.app.recovery.samples import MNI, NAMES, tissue_maps, volume_data
from tests.app.recovery.sessions import end_session, next_session, open_session

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).parent


def _child(script: str, *args: str) -> subprocess.CompletedProcess:
    """Runs ``script`` (a child_*.py beside this file) in a fresh interpreter from the repository's root."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, str(HERE / script), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,  # a bound for a hung process, not a speed check
    )


def _kill_after_keeping(root: Path, tissue: bool = False) -> subprocess.CompletedProcess:
    """A process that keeps one volume in a recovery store under ``root`` and is then killed (SIGKILL);
    ``tissue``: with the maps of ``tissue_maps(3)`` and the MNI space, as the tissue model's volumes are
    kept."""
    return _child("child_keep_then_killed.py", str(root), *(["tissue"] if tissue else []))


def test_keep_forget_and_clean_exit(tmp_path):
    store = RecoveryStore(tmp_path)
    store.open()
    assert store.folder is not None and (store.folder / "lock").is_file()
    path = store.keep(7, "seed 1 · fp32", Volume(volume_data(), np.eye(4), provenance={"seed": 1}))
    sidecar = json.loads(path.with_name(path.name.replace(".nii.gz", ".json")).read_text())
    assert path.is_file() and sidecar["seed"] == 1 and sidecar["recovery_name"] == "seed 1 · fp32"
    store.keep(8, "other", Volume(volume_data(1), np.eye(4), provenance={}))
    store.forget(7)
    assert not path.exists() and store.kept() == [8]
    folder = store.folder
    store.close()
    assert not folder.exists()


def test_a_live_session_is_not_an_orphan(tmp_path):
    live, other = RecoveryStore(tmp_path), RecoveryStore(tmp_path)
    live.open()
    live.keep(1, "v", Volume(volume_data(), np.eye(4), provenance={}))
    other.open()
    assert other.orphans() == []  # same process, but its lock is held: not abandoned
    live.close()
    other.close()


def test_forgetting_while_the_write_runs_leaves_nothing(tmp_path):
    store = RecoveryStore(tmp_path)
    store.open()
    store.forget(5)  # removed from the session before the worker got to write it
    path = store.keep(5, "v", Volume(volume_data(), np.eye(4), provenance={}))
    assert not path.exists() and store.kept() == []
    store.close()


@pytest.mark.slow
def test_a_killed_process_leaves_an_orphan_that_restores_exactly(tmp_path):
    done = _kill_after_keeping(tmp_path)
    assert done.returncode == -signal.SIGKILL, done.stderr
    store = RecoveryStore(tmp_path)
    store.open()
    orphans = store.orphans()
    assert len(orphans) == 1 and len(orphans[0].volumes) == 1
    assert re.fullmatch(
        r"1 generated volume made \d\d \w{3} \d\d:\d\d, from a session that ended unexpectedly",
        orphans[0].describe(),
    )
    ((name, opened),) = store.restore(orphans[0])
    loaded = opened  # the engine volume record itself
    assert (
        name == "seed 3 · crashed"
        and loaded.provenance["seed"] == 3
        and "recovery_name" not in loaded.provenance
    )
    assert np.array_equal(loaded.data, np.random.default_rng(3).random((6, 7, 5), dtype=np.float32))
    assert opened.tissue == {} and opened.space is None and loaded.path is None
    assert orphans[0].folder.exists()  # kept until discarded: a failed restore loses nothing
    store.discard(orphans[0])
    assert store.orphans() == []
    store.close()


@pytest.mark.slow
def test_a_killed_process_leaves_the_tissue_maps_that_restore_exactly_with_the_space(tmp_path):
    done = _kill_after_keeping(tmp_path, tissue=True)
    assert done.returncode == -signal.SIGKILL, done.stderr
    store = RecoveryStore(tmp_path)
    store.open()
    (orphan,) = store.orphans()
    assert len(orphan.volumes) == 1  # the image: its maps beside it are not volumes of their own
    assert orphan.describe().startswith("1 generated volume made ")
    assert orphan.describe().endswith(", from a session that ended unexpectedly")
    ((name, opened),) = store.restore(orphan)
    assert name == "seed 3 · crashed" and opened.space == MNI and opened.notes == []
    assert list(opened.tissue) == NAMES
    for map_name, expected in tissue_maps(3).items():
        assert np.array_equal(opened.tissue[map_name], expected), map_name
    assert opened.provenance["space"] == MNI
    assert "tissue_maps" not in opened.provenance  # the recovery folder's names stay behind
    store.discard(orphan)
    store.close()


def test_tissue_maps_are_written_with_the_image_and_go_with_it(tmp_path):
    import nibabel as nib

    store = RecoveryStore(tmp_path)
    store.open()
    # A space the provenance does not name still comes back (and sets the sform code).
    path = store.keep(
        4,
        "with maps",
        Volume(
            volume_data(4),
            np.diag([2.0, 2.0, 2.0, 1.0]),
            provenance={"seed": 4},
            tissue=tissue_maps(4),
            space=MNI,
        ),
    )
    stem = path.name.removesuffix(".nii.gz")
    maps = {name: path.with_name(f"{stem}_label-{name}_probseg.nii.gz") for name in NAMES}
    assert sorted(p.name for p in store.folder.iterdir()) == sorted(
        ["lock", path.name, f"{stem}.json", *(p.name for p in maps.values())]
    )  # no temporary left
    sidecar = json.loads(path.with_name(f"{stem}.json").read_text())
    assert sidecar["tissue_maps"] == {name: p.name for name, p in maps.items()}
    assert sidecar["recovery_name"] == "with maps" and sidecar["recovery_space"] == MNI
    assert all(int(nib.load(p).header["sform_code"]) == 4 for p in (path, *maps.values()))
    plain = store.keep(5, "without", Volume(volume_data(5), np.eye(4), provenance={"seed": 5}))
    store.forget(4)  # removed from the session: its maps go too
    assert sorted(p.name for p in store.folder.iterdir()) == sorted(
        ["lock", plain.name, plain.name.replace(".nii.gz", ".json")]
    )
    path = store.keep(
        6,
        "kept",
        Volume(
            volume_data(6), np.eye(4), provenance={"seed": 6, "space": MNI}, tissue=tissue_maps(6), space=MNI
        ),
    )
    store.close(keep=True)

    (left,) = RecoveryStore(tmp_path).orphans()
    assert [p.name for p in left.volumes] == [plain.name, path.name]
    assert left.describe().startswith("2 unsaved generated volumes made ")
    assert left.describe().endswith("from your last session")
    (_, without), (name, opened) = RecoveryStore.restore(left)
    assert without.tissue == {} and without.space is None
    assert name == "kept" and opened.space == MNI and list(opened.tissue) == NAMES
    assert all(np.array_equal(opened.tissue[n], m) for n, m in tissue_maps(6).items())
    assert not {"recovery_name", "recovery_space", "tissue_maps"} & set(opened.provenance)
    RecoveryStore.discard(left)


def test_a_folder_kept_before_tissue_maps_still_restores(tmp_path):
    """What earlier versions left: image + sidecar written by ``engine.nifti.io.save_volume``, no maps; and a
    write's temporary cut short by the crash, which is not offered."""
    from engine.nifti.io import save_volume
    from engine.nifti.volume import Volume

    folder = tmp_path / "20260101-000000-42-abc"
    folder.mkdir()
    (folder / "lock").write_text(json.dumps({"pid": 42, "started": 1.0}))
    image = folder / "1767225600000000000-3.nii.gz"
    save_volume(
        Volume(volume_data(3), np.eye(4), provenance={"seed": 3, "recovery_name": "old"}, synthetic=True),
        image,
    )
    (folder / ".1767225600000000001-4.nii.gz.x1y2.partial.nii.gz").write_bytes(b"cut short")
    (orphan,) = RecoveryStore(tmp_path).orphans()
    assert orphan.volumes == [image]
    ((name, opened),) = RecoveryStore.restore(orphan)
    assert name == "old" and opened.tissue == {} and opened.space is None and opened.notes == []
    assert np.array_equal(opened.data, volume_data(3)) and opened.provenance["seed"] == 3


def test_a_clean_exit_keeps_only_what_asks_to_be_kept(tmp_path):
    store = RecoveryStore(tmp_path)
    store.open()
    store.keep(1, "unsaved", Volume(volume_data(), np.eye(4), provenance={}))
    store.close(keep=True)
    (left,) = RecoveryStore(tmp_path).orphans()
    assert left.clean_exit and [p.name.split("-")[-1] for p in left.volumes] == ["1.nii.gz"]
    RecoveryStore.discard(left)
    store = RecoveryStore(tmp_path)
    store.open()
    store.keep(2, "saved elsewhere", Volume(volume_data(), np.eye(4), provenance={}))
    store.close(keep=False)
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_place_turns_recovery_off_without_failing(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    store = RecoveryStore(blocker / "recovery")
    store.open()
    assert (
        store.folder is None and store.keep(1, "v", Volume(volume_data(), np.eye(4), provenance={})) is None
    )
    store.close()


# -- the app ------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.render
def test_generated_volume_survives_a_killed_app(qtbot, app_services, tiny_models_dir, tmp_path):
    root = tmp_path / "recovery"
    done = _child("child_app_generates.py", str(tiny_models_dir), str(root), "killed")
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    name, total = done.stdout.strip().splitlines()[-1].rsplit(" ", 1)

    recovery = open_session(app_services, root)
    state, bar = app_services.state, recovery.bar
    assert bar.isVisible() and "1 generated volume made " in bar.label.text()
    assert "from a session that ended unexpectedly" in bar.label.text()
    assert state.volumes == []
    bar.restore_button.click()
    qtbot.waitUntil(lambda: not bar.isVisible() and not app_services.runner.jobs, timeout=30_000)
    (entry,) = state.volumes
    assert entry.name == name and entry.kind == "generated" and entry.synthetic
    assert float(entry.data.astype("float64").sum()) == pytest.approx(float(total), rel=1e-6)
    assert entry.provenance["seed"] == 11 and entry.provenance["model"]["id"] == "tiny-latent"
    assert state.shown is entry
    # The crashed session's folder is gone; the volume is now kept by this session instead.
    folders = [p for p in root.iterdir() if p.is_dir()]
    assert folders == [recovery.store.folder] and len(list(folders[0].glob("*.nii.gz"))) == 1
    end_session(qtbot, app_services, recovery)
    # Closed without saving it: it stays for the next start, now as a clean exit's leftover.
    (left,) = RecoveryStore(root).orphans()
    assert left.clean_exit and len(left.volumes) == 1
    assert left.describe().startswith("1 unsaved generated volume made ")
    assert left.describe().endswith("from your last session")


@pytest.mark.slow
@pytest.mark.render
def test_discard_can_be_undone_until_quit_and_says_when_each_volume_was_made(qtbot, app_services, tmp_path):
    root = tmp_path / "recovery"
    assert _kill_after_keeping(root).returncode == -signal.SIGKILL
    (orphan,) = RecoveryStore(root).orphans()
    made = time.strftime("%d %b %H:%M", time.localtime(orphan.volumes[0].stat().st_mtime))
    recovery = open_session(app_services, root)
    bar = recovery.bar
    assert bar.isVisible() and f"made {made}" in bar.label.text()  # when the volume was made
    assert orphan.volumes[0].name in bar.label.toolTip() and "made" in bar.label.toolTip()
    qtbot.mouseClick(bar.discard_button, Qt.MouseButton.LeftButton)
    assert bar.isVisible() and bar.undo_button.isVisible() and "deleted when you quit" in bar.label.text()
    assert app_services.state.volumes == [] and not RecoveryStore(root).orphans()
    assert len(list(root.glob("*.discarded/*.nii.gz"))) == 1  # set aside, not deleted yet
    qtbot.mouseClick(bar.undo_button, Qt.MouseButton.LeftButton)  # changed my mind
    assert bar.restore_button.isVisible() and f"made {made}" in bar.label.text()
    assert len(recovery.orphans) == 1 and not list(root.glob("*.discarded"))
    qtbot.mouseClick(bar.discard_button, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(bar.close_button, Qt.MouseButton.LeftButton)
    assert not bar.isVisible()
    end_session(qtbot, app_services, recovery)  # the undo time ends with the session: now it is gone
    assert list(root.iterdir()) == []


@pytest.mark.slow
@pytest.mark.render
def test_the_recovery_folder_follows_the_session_list(qtbot, generating, tmp_path):
    recovery = open_session(generating.services, tmp_path / "recovery")
    generating.select("tiny-pixel", steps=3)
    for batch in (1, 3):
        generating.sampling_panel.batch_spin.setValue(batch)
        generating.sampling_panel.generate_button.click()
        assert generating.wait_ended(qtbot, timeout=60_000) == "finished"
    state = generating.services.state
    folder = recovery.store.folder
    assert len(list(folder.glob("*.nii.gz"))) == 4
    first = state.volumes[0]
    state.remove_volume(first)
    kept = list(folder.glob("*.nii.gz"))
    assert len(kept) == 3 and not any(p.name.endswith(f"-{first.uid}.nii.gz") for p in kept)
    end_session(qtbot, generating.services, recovery)


@pytest.mark.slow
@pytest.mark.render
def test_closing_with_unsaved_volumes_keeps_them_and_saved_ones_go(qtbot, generating, tmp_path):
    root = tmp_path / "recovery"
    services = generating.services
    recovery = open_session(services, root)
    generating.select("tiny-pixel", steps=3)
    generating.sampling_panel.batch_spin.setValue(2)
    generating.sampling_panel.generate_button.click()
    assert generating.wait_ended(qtbot, timeout=60_000) == "finished"
    saved, unsaved = services.state.volumes
    generating.files.save_entry(saved, tmp_path / "saved.nii.gz")
    qtbot.waitUntil(lambda: saved.saved and not services.runner.jobs, timeout=30_000)
    end_session(qtbot, services, recovery)

    services = next_session(services)
    recovery = open_session(services, root)
    assert "1 unsaved generated volume made " in recovery.bar.label.text()
    recovery.bar.restore_button.click()
    qtbot.waitUntil(lambda: not recovery.bar.isVisible() and not services.runner.jobs, timeout=30_000)
    (entry,) = services.state.volumes
    assert entry.name == unsaved.name and np.array_equal(entry.data, unsaved.data)
    entry.saved = True  # as if saved now: the next clean exit has nothing left to keep
    end_session(qtbot, services, recovery)
    assert list(root.iterdir()) == []


@pytest.mark.slow
@pytest.mark.render
def test_generated_tissue_maps_come_back_with_the_volume_after_a_restart(
    qtbot, generating, tissue_models_dir, tmp_path
):
    from app.core.tissue import ALL_TISSUES
    from app.viewer.tissue_toolbar import TissueToolbar
    from app.window.status_bar import WindowStatus

    root = tmp_path / "recovery"
    services = generating.services
    assert services.open_model_folder(tissue_models_dir / "tiny-tissue")  # Generate > Open Model Folder...
    recovery = open_session(services, root)
    generating.select("tiny-tissue", steps=3)
    generating.sampling_panel.generate_button.click()
    assert generating.wait_ended(qtbot) == "finished"
    generated = services.state.shown
    assert generated.tissue_names == NAMES and generated.space == MNI
    folder = recovery.store.folder
    assert len(list(folder.glob("*.nii.gz"))) == 1 + len(NAMES)  # the image and its maps
    end_session(qtbot, services, recovery)  # never saved: kept for the next start

    services = next_session(services)
    state = services.state
    host = services.parent
    status = WindowStatus(host.statusBar())  # the status bar's fields of the shown volume
    state.shown_changed.connect(status.show_volume)
    tools = TissueToolbar(state, host)
    host.addToolBar(tools)
    recovery = open_session(services, root)
    bar = recovery.bar
    assert bar.isVisible() and "1 unsaved generated volume made " in bar.label.text()
    bar.restore_button.click()
    qtbot.waitUntil(lambda: not bar.isVisible() and not services.runner.jobs, timeout=30_000)
    assert "1 with tissue maps" in host.statusBar().currentMessage()
    (entry,) = state.volumes
    assert entry.name == generated.name and entry.kind == "generated" and state.shown is entry
    assert np.array_equal(entry.data, generated.data) and np.allclose(entry.affine, generated.affine)
    assert entry.space == MNI and entry.tissue_names == NAMES
    for name in NAMES:
        assert np.array_equal(entry.tissue[name], generated.tissue[name]), name
    assert status.space_label.text() == f"Space: {MNI}"
    assert tools.tissue_action.isEnabled() and tools.tissue_box.isEnabled()
    tools.tissue_action.trigger()  # the overlay, as Ctrl+T turns it on
    assert state.tissue_shown() == ALL_TISSUES
    # This session keeps it again, maps included, until it is saved.
    folder = recovery.store.folder
    qtbot.waitUntil(lambda: len(list(folder.glob("*.nii.gz"))) == 1 + len(NAMES), timeout=30_000)
    entry.saved = True
    end_session(qtbot, services, recovery)
    assert list(root.iterdir()) == []


@pytest.mark.slow
def test_quitting_without_closing_the_window_is_still_a_clean_exit(tiny_models_dir, tmp_path):
    root = tmp_path / "recovery"
    done = _child("child_app_generates.py", str(tiny_models_dir), str(root), "quit")
    assert done.returncode == 0, done.stderr[-2000:]
    (left,) = RecoveryStore(root).orphans()
    assert left.clean_exit and len(left.volumes) == 1  # unsaved, so kept; but not called a crash


@pytest.mark.slow
def test_the_demo_run_leaves_nothing_to_recover(tmp_path):
    """`volsynth-studio --demo` (the main job's headless check) on the shipped model, start to finish."""
    env = {
        **os.environ,
        "QT_QPA_PLATFORM": "offscreen",
        "XDG_DATA_HOME": str(tmp_path / "data"),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }
    png = tmp_path / "demo.png"
    done = subprocess.run(
        [sys.executable, "-m", "app", "--no-3d", "--demo", str(png)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    assert "demo: generation finished" in done.stdout and png.stat().st_size > 10_000
    recovery = tmp_path / "data" / "volsynth" / "recovery"
    assert not recovery.exists() or list(recovery.iterdir()) == []


@pytest.mark.render
def test_a_restored_volume_left_unsaved_again_says_when_it_was_made_not_when_it_was_restored(
    qtbot, app_services, tmp_path
):
    """Made two days ago, restored today, the app closed without saving it: the next start's bar said it was
    made today (the time of the restore, which rewrote its file)."""
    from engine.nifti.io import sidecar_path

    root = tmp_path / "recovery"
    assert _kill_after_keeping(root).returncode == -signal.SIGKILL
    (orphan,) = RecoveryStore(root).orphans()
    sidecar = sidecar_path(orphan.volumes[0])
    record = json.loads(sidecar.read_text())
    assert record["made_at"]  # said when it was kept at the end of its run
    two_days_ago = time.time() - 2 * 86400
    record["made_at"] = datetime.fromtimestamp(two_days_ago, UTC).isoformat(timespec="seconds")
    sidecar.write_text(json.dumps(record))
    made = time.strftime("%d %b %H:%M", time.localtime(two_days_ago))

    recovery = open_session(app_services, root)
    bar = recovery.bar
    assert f"made {made}" in bar.label.text()
    qtbot.mouseClick(bar.restore_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not bar.isVisible() and not app_services.runner.jobs, timeout=30_000)
    end_session(qtbot, app_services, recovery)  # not saved: kept for the next start
    services = next_session(app_services)
    recovery = open_session(services, root)
    bar = recovery.bar
    assert bar.isVisible() and f"made {made}" in bar.label.text(), bar.label.text()
    assert f"made {time.strftime('%d %b', time.localtime(two_days_ago))}" in bar.label.toolTip()
    qtbot.mouseClick(bar.discard_button, Qt.MouseButton.LeftButton)
    end_session(qtbot, services, recovery)
