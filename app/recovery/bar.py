"""The main window's side of crash recovery (``app.recovery``): keep generated volumes, offer orphans back.

``RecoveryController`` follows the session list: each generated volume that appears is written to this
session's recovery folder in a worker thread, each one removed is deleted there; at a clean exit the ones
never saved stay. At start it looks for sessions that died or left unsaved volumes and shows a bar above
the viewer, *Restore* or *Discard*; it never asks with a modal dialog, so a start is never blocked.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable

import numpy as np
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from app.core.recovery import OrphanSession, RecoveryStore, made_time
from app.core.volumes import VolumeEntry
from app.services import AppServices
from engine.formatting import count_of
from engine.nifti.volume import Volume

log = logging.getLogger(__name__)


class RecoveryBar(QFrame):
    """'3 generated volumes from a session that ended unexpectedly (30 Nov 02:10)' [Restore] [Discard]."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("recoveryBar")
        self.setStyleSheet(
            "#recoveryBar { background: #3a3220; border: 1px solid #e5c07b; border-radius: 4px; }"
        )
        self.label = QLabel("")
        self.label.setWordWrap(True)
        self.restore_button = QPushButton("Restore")
        self.restore_button.setToolTip("Put the volumes back in the session list")
        self.discard_button = QPushButton("Discard")
        self.discard_button.setToolTip("Delete them when you quit (Undo brings them back until then)")
        self.undo_button = QPushButton("Undo")
        self.undo_button.setToolTip("Offer the discarded volumes again")
        self.undo_button.hide()
        self.close_button = QPushButton("OK")
        self.close_button.setToolTip("Hide this bar (the discarded volumes are deleted when you quit)")
        self.close_button.hide()
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.restore_button)
        layout.addWidget(self.discard_button)
        layout.addWidget(self.undo_button)
        layout.addWidget(self.close_button)
        self.hide()

    def show_offer(self, text: str, tip: str) -> None:
        self.label.setText(text)
        self.label.setToolTip(tip)
        for button, visible in (
            (self.restore_button, True),
            (self.discard_button, True),
            (self.undo_button, False),
            (self.close_button, False),
        ):
            button.setVisible(visible)
            button.setEnabled(True)
        self.show()

    def show_discarded(self, text: str) -> None:
        self.label.setText(text)
        self.label.setToolTip("")
        for button, visible in (
            (self.restore_button, False),
            (self.discard_button, False),
            (self.undo_button, True),
            (self.close_button, True),
        ):
            button.setVisible(visible)
            button.setEnabled(True)
        self.show()


class RecoveryController:
    def __init__(
        self, state, runner, store: RecoveryStore, bar: RecoveryBar, *, show_status: Callable[..., None]
    ) -> None:
        self.state, self.runner, self.store, self.bar, self.show_status = (
            state,
            runner,
            store,
            bar,
            show_status,
        )
        self.orphans: list[OrphanSession] = []
        self.keep_unsaved = (
            True  # False for runs nobody works in (--demo): their volumes are checks, not work
        )
        self._known: set[int] = set()
        self.discarded: list[OrphanSession] = []  # set aside by Discard; Undo offers them again
        store.purge()  # what an earlier session discarded (its undo ended with it)
        store.open()
        state.volumes_changed.connect(self._on_state_volumes_changed)
        bar.restore_button.clicked.connect(self.restore)
        bar.discard_button.clicked.connect(self.discard)
        bar.undo_button.clicked.connect(self.undo_discard)
        bar.close_button.clicked.connect(bar.hide)

    def look_for_orphans(self) -> None:
        self.orphans = self.store.orphans()
        if not self.orphans:
            self.bar.hide()
            return
        volumes = sum(len(o.volumes) for o in self.orphans)
        first = self.orphans[0].describe()
        more = (
            f" and {count_of(len(self.orphans) - 1, 'earlier session')}, {volumes} volumes in all"
            if len(self.orphans) > 1
            else ""
        )
        made = [
            f"{path.name}: made {time.strftime('%d %b %H:%M:%S', time.localtime(when))}"
            for orphan in self.orphans
            for path in orphan.volumes
            if path.exists() and (when := made_time(path) or path.stat().st_mtime)
        ]
        self.bar.show_offer(f"Kept for you: {first}{more}.", "\n".join(made))

    def restore(self) -> None:
        if not self.orphans:
            return
        self.bar.restore_button.setEnabled(False)
        self.bar.discard_button.setEnabled(False)
        self.bar.label.setText("Restoring...")
        orphans = list(self.orphans)
        self.runner.run_task(
            "recovery-restore",
            _restore_all,
            orphans,
            finished=self._on_restored,
            failed=self._on_restore_failed,
        )

    def discard(self) -> None:
        """Discard, with an undo: the volumes are set aside and deleted when this session ends cleanly."""
        volumes = sum(len(o.volumes) for o in self.orphans)
        aside = []
        for orphan in self.orphans:
            try:
                aside.append(self.store.set_aside(orphan))
            except OSError as exc:
                log.warning("could not set %s aside: %s", orphan.folder, exc)
        self.discarded.extend(aside)
        self.orphans = []
        self.bar.show_discarded(
            f"Discarded {count_of(volumes, 'generated volume')}: "
            "they are deleted when you quit. Undo brings them back."
        )
        self.show_status("Discarded the volumes of the earlier session (Undo on the bar)", 5000)

    def undo_discard(self) -> None:
        for session in self.discarded:
            try:
                self.store.take_back(session)
            except OSError as exc:
                log.warning("could not take %s back: %s", session.folder, exc)
        self.discarded = []
        self.look_for_orphans()

    def close(self) -> None:
        """Clean exit: volumes saved to a file or the vault are let go; unsaved ones stay for the next start."""
        unsaved = False
        for entry in self.state.volumes:
            if entry.kind == "generated":
                if entry.saved or not self.keep_unsaved:
                    self.store.forget(entry.uid)
                else:
                    unsaved = True
        self.store.close(keep=unsaved)
        self.store.purge()  # Discard's undo ends with the session
        self.discarded = []

    def _on_restored(self, restored) -> None:
        sessions, volumes = restored
        notes: list[str] = []
        for name, opened in volumes:
            # the record itself: its tissue maps ({} for a volume without, or kept before maps were) and space
            opened.data = np.ascontiguousarray(opened.data, dtype=np.float32)
            opened.synthetic = True
            self.state.add_volume(VolumeEntry(name, volume=opened, kind="generated"), show=False)
            notes.extend(f"{name}: {note}" for note in opened.notes)
        for orphan in sessions:  # now kept again by this session (volumes_changed wrote them)
            self.store.discard(orphan)
        self.orphans = []
        self.bar.hide()
        if volumes:
            self.state.show(self.state.volumes[-1])
        for note in notes:
            log.warning("restoring a generated volume: %s", note)
        mapped = sum(1 for _, opened in volumes if opened.tissue)
        maps = f", {mapped} with tissue maps" if mapped else ""
        skipped = f" ({count_of(len(notes), 'tissue map')} could not be read)" if notes else ""
        self.show_status(f"Restored {count_of(len(volumes), 'generated volume')}{maps}{skipped}", 10000)

    def _on_restore_failed(self, message: str) -> None:
        self.bar.label.setText(
            f"Could not restore: {message}. The files stay where they are: "
            f"{self.orphans[0].folder if self.orphans else ''}"
        )
        self.bar.discard_button.setEnabled(True)

    def _on_state_volumes_changed(self) -> None:
        # Only volumes made in this session: one decrypted from the vault is never written in plaintext here.
        generated = {e.uid: e for e in self.state.volumes if e.kind == "generated" and e.vault_item is None}
        for uid in self._known - set(generated):
            self.store.forget(uid)
        # Each entry's record, with its maps as they are now: a map computed later does not reach the writer
        # halfway through its files.
        new = [
            (e.uid, e.name, dataclasses.replace(e.volume, tissue=dict(e.tissue)))
            for uid, e in generated.items()
            if uid not in self._known
        ]
        if (
            new
        ):  # one thread writes a batch in turn: sixteen parallel gzip writers would only fight for the CPU
            self.runner.run_task("recovery-keep", _keep_all, self.store, new, failed=self._on_keep_failed)
        self._known = set(generated)

    def _on_keep_failed(self, message: str) -> None:
        log.warning("a generated volume could not be kept for crash recovery: %s", message)
        self.show_status(f"Crash recovery could not keep a volume: {message}", 10000)


def _keep_all(store: RecoveryStore, volumes: list[tuple[int, str, Volume]]) -> None:
    for uid, name, volume in volumes:
        store.keep(uid, name, volume)


def _restore_all(orphans: list[OrphanSession]):
    volumes = []
    for orphan in orphans:
        volumes.extend(RecoveryStore.restore(orphan))
    return orphans, volumes


def install_recovery(services: AppServices, store: RecoveryStore, bar: RecoveryBar) -> RecoveryController:
    """Keep the session's generated volumes in ``store`` and offer a crashed session's back on ``bar``."""
    return RecoveryController(services.state, services.runner, store, bar, show_status=services.show_status)
