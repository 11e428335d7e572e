"""What the vault's app tests share: a passphrase, fast Argon2 parameters, and the steps a user takes (create,
import, open) driven through the vault controller's pieces, each waiting for its background task to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.vault import KdfParams

PASSPHRASE = "correct horse battery staple"
#: Test-only Argon2 parameters (1 MiB, t=1, p=1); the default (64 MiB, t=3, p=4) takes ~0.3 s per unlock.
FAST_KDF = KdfParams(memory_kib=1024, iterations=1, lanes=1)


def point_at_new_vault(window, folder: Path):
    controller = window.vault_controller
    controller.session.kdf = FAST_KDF
    controller.locking.set_vault_path(folder)
    return window


def wait_task(qtbot, controller, name: str, timeout: int = 30_000) -> str:
    """Wait for the named background task to end; its outcome (finished, failed, cancelled)."""
    with qtbot.waitSignal(
        controller.task_ended, timeout=timeout, check_params_cb=lambda task, outcome: task == name
    ) as blocker:
        pass
    return blocker.args[1]


def create_via_dialog(qtbot, window):
    controller = window.vault_controller
    dialog = controller.locking.request_unlock()
    assert dialog is not None and dialog.mode == "create"
    dialog.passphrase_edit.setText(PASSPHRASE)
    dialog.confirm_edit.setText(PASSPHRASE)
    dialog.ok_button.click()
    assert wait_task(qtbot, controller, "create") == "finished"
    qtbot.waitUntil(lambda: controller.session.is_unlocked and not controller.tasks.running, timeout=10_000)
    return controller


def import_items(qtbot, controller, paths, rows: int, **details):
    controller.importing.import_nifti([Path(p) for p in paths], **details)
    assert wait_task(qtbot, controller, "import") == "finished"
    qtbot.waitUntil(lambda: controller.browser.table.rowCount() == rows, timeout=10_000)


def open_item(qtbot, window, item_id: str):
    with qtbot.waitSignal(window.volume_opened, timeout=20_000) as blocker:
        window.vault_controller.opening.open_item(item_id)
    qtbot.waitUntil(lambda: not window.vault_controller.tasks.running, timeout=10_000)
    return blocker.args[0]


def generated_entry(window, seed: int = 11):
    """A generated volume in the session (as the Generate button leaves it), without running a model."""
    from app.core.volumes import VolumeEntry

    data = np.random.default_rng(seed).random((10, 12, 8)).astype(np.float32)
    entry = VolumeEntry(
        name=f"tiny-latent seed {seed}",
        data=data,
        affine=np.eye(4),
        kind="generated",
        provenance={"model": {"id": "tiny-latent"}, "seed": seed, "synthetic": True},
        synthetic=True,
    )
    window.state.add_volume(entry)
    return entry
