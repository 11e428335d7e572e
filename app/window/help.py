"""The Help menu: a keyboard shortcuts list and a short user guide, both as dialogs.

Every shortcut is declared once, in ``app.services.shortcuts.SHORTCUTS``: the actions set their keys from it, and the
list shows it. The actions' rows are read from the window's own ``QAction`` objects each time the list opens
(menu path, text and every key sequence), so what is listed is what works even if a key is changed at run
time; the table's entries that no action carries (the slice views' keys, the mouse, the Compare window's
keys) are listed as the table writes them.

``HelpMenu(window, menu)`` adds "Keyboard Shortcuts" (Ctrl+/) and "User Guide" (F1) to ``menu``.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence, QTextCursor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QPushButton,
    QSizePolicy,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QToolBar,
    QVBoxLayout,
    QWidget,
)

from app.core.intended_use import ACKNOWLEDGED_KEY, INTENDED_USE_HEADLINE, INTENDED_USE_TEXT
from app.services.shortcuts import (
    ID_PROPERTY,
    SHORTCUTS,
    SLICE_VIEWS,
    SLICE_VIEWS_MOUSE,
    listed_without_action,
    set_shortcut,
)
from app.services.shortcuts import VIEW3D_MOUSE as VIEW3D_MOUSE_WHERE


def _table_pairs(where: str) -> tuple[tuple[str, str], ...]:
    return tuple((entry.native_text(), entry.what) for entry in SHORTCUTS.values() if entry.where == where)


# The keys a slice view handles itself, and the mouse: views of the one table (app/services/shortcuts.py).
# tests/app/window/test_help.py sends each of VIEWER_KEYS to a real slice view and fails if the view ignores it.
VIEWER_KEYS: tuple[tuple[str, str], ...] = _table_pairs(SLICE_VIEWS)
VIEWER_MOUSE: tuple[tuple[str, str], ...] = _table_pairs(SLICE_VIEWS_MOUSE)
VIEW3D_MOUSE: tuple[tuple[str, str], ...] = _table_pairs(VIEW3D_MOUSE_WHERE)


@dataclass(frozen=True)
class ShortcutRow:
    """One line of the shortcuts list."""

    keys: str  # as the platform writes them ("Ctrl+S")
    what: str  # the action's text without mnemonics ("Save As NIfTI...")
    where: str  # menu path ("File"), or the widget the key works in


def _plain(text: str) -> str:
    """A menu text without its mnemonic marks: "&Save As..." -> "Save As...", "R&&D" -> "R&D"."""
    return text.replace("&&", "\0").replace("&", "").replace("\0", "&")


def _keys(action: QAction) -> str:
    return ", ".join(
        sequence.toString(QKeySequence.SequenceFormat.NativeText)
        for sequence in action.shortcuts()
        if not sequence.isEmpty()
    )


def action_shortcuts(window: QWidget) -> list[ShortcutRow]:
    """Every action of ``window`` that has a shortcut: the menus first (in menu order), then any others."""
    rows: list[ShortcutRow] = []
    seen: set[int] = set()

    def walk(menu: QMenu, path: str) -> None:
        for action in menu.actions():
            submenu = action.menu()
            if isinstance(submenu, QMenu):
                walk(submenu, f"{path} \u203a {_plain(submenu.title())}")
                continue
            if action.isSeparator() or id(action) in seen:
                continue
            seen.add(id(action))
            keys = _keys(action)
            if keys:
                rows.append(ShortcutRow(keys, _plain(action.text()), path))

    menu_bar = window.menuBar() if hasattr(window, "menuBar") else None
    if menu_bar is not None:
        for top in menu_bar.actions():
            if top.menu() is not None:
                walk(top.menu(), _plain(top.menu().title()))
    for action in window.findChildren(QAction):
        keys = _keys(action)
        if keys and id(action) not in seen and action.text():
            seen.add(id(action))
            entry = SHORTCUTS.get(action.property(ID_PROPERTY) or "")
            # Outside the menus, the table says where the keys work (the session list, the viewer tool bar).
            rows.append(ShortcutRow(keys, _plain(action.text()), entry.where if entry else "Main window"))
    return rows


def all_shortcuts(window: QWidget) -> list[ShortcutRow]:
    """The window's actions (whose keys are set from the table), then the table's entries no action
    carries: the slice views' keys and mouse, the 3D view's mouse, the Compare window's keys."""
    return [
        *action_shortcuts(window),
        *(ShortcutRow(entry.native_text(), entry.what, entry.where) for _, entry in listed_without_action()),
    ]


class ShortcutsDialog(QDialog):
    """Help > Keyboard Shortcuts: a filterable table, rebuilt from the window's actions each time it opens."""

    def __init__(self, window: QWidget) -> None:
        super().__init__(window)
        self.window_ = window
        self.setWindowTitle("Keyboard Shortcuts \u2014 VolSynth Studio")
        self.setObjectName("shortcutsDialog")
        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("Filter: type part of a name, a menu or a key")
        self.filter_edit.setClearButtonEnabled(True)
        self.filter_edit.textChanged.connect(self._on_filter_edit_changed)
        self.table = QTableWidget(0, 3)
        self.table.setObjectName("shortcutsTable")
        self.table.setHorizontalHeaderLabels(["Keys", "Does", "Where"])
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.verticalHeader().setVisible(False)
        self.table.setWordWrap(True)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        note = QLabel(
            "Read from the menus as they are now. Window-wide keys work wherever the focus is in the main "
            "window; slice-view keys work in the view under the focus (click it first)."
        )
        note.setWordWrap(True)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        layout = QVBoxLayout(self)
        layout.addWidget(self.filter_edit)
        layout.addWidget(self.table, 1)
        layout.addWidget(note)
        layout.addWidget(buttons)
        self.resize(640, 600)
        self.rows: list[ShortcutRow] = []

    def refresh(self) -> None:
        """Read the shortcuts again (actions may have been added since the last time)."""
        self.rows = all_shortcuts(self.window_)
        self.table.setRowCount(len(self.rows))
        for index, row in enumerate(self.rows):
            for column, text in enumerate((row.keys, row.what, row.where)):
                item = QTableWidgetItem(text)
                if column == 0:
                    font = item.font()
                    font.setBold(True)
                    item.setFont(font)
                self.table.setItem(index, column, item)
        self.table.resizeRowsToContents()
        self._on_filter_edit_changed(self.filter_edit.text())

    def visible_rows(self) -> list[ShortcutRow]:
        return [row for index, row in enumerate(self.rows) if not self.table.isRowHidden(index)]

    def _on_filter_edit_changed(self, text: str) -> None:
        needle = text.strip().lower()
        for index, row in enumerate(self.rows):
            hay = f"{row.keys} {row.what} {row.where}".lower()
            self.table.setRowHidden(index, bool(needle) and needle not in hay)


def user_folders(window: QWidget) -> list[tuple[str, Path | str, str]]:
    """(what, where, note) for the files the app keeps, as they are on this machine now."""
    from app.core.recovery import default_recovery_dir
    from engine.models.registry import user_models_dir
    from engine.vault.store import default_vault_path

    settings = getattr(window, "settings", None)
    settings_file = settings.fileName() if settings is not None else "(the platform's settings store)"
    return [
        (
            "Crash recovery",
            default_recovery_dir(),
            "every generated volume is kept here until it is saved, vaulted or removed; the next start "
            "offers what a crashed session left",
        ),
        (
            "Vault",
            default_vault_path(),
            "encrypted patient and synthetic volumes ($VOLSYNTH_VAULT chooses another folder)",
        ),
        ("Your models", user_models_dir(), "model folders placed here appear in the model list"),
        (
            "Settings",
            settings_file,
            "window layout, last choices (model, Compare A/B), recent files; no patient data",
        ),
    ]


GUIDE_PANELS = (
    (
        "Generate panel",
        "Pick a model, sampler, steps, seed, guidance and the conditioning values (age, volumes...), then "
        "Generate[[Generate]]. The Optimization section chooses precision, quantization, attention kernel and "
        "compilation; each setting says whether it applies on the chosen device. Progress and the time left "
        "show under the button and in the status bar.",
    ),
    (
        "Session list",
        "Every volume of this session: generated ones, files you opened and vault items you viewed. Click "
        "one to show it; Previous Volume[[Previous Volume]] and Next Volume[[Next Volume]] step through them.",
    ),
    (
        "Slice views and 3D view",
        "Axial, coronal and sagittal slices share one crosshair; the 3D view renders the volume or an "
        "iso-surface. Window/level presets are in the toolbar and the View menu. A volume with tissue maps "
        "(GM, WM, CSF, ventricles) can have them coloured over its slices: Tissue Overlay[[Tissue Overlay]], "
        "with the map and its opacity beside it. The status bar names the volume's space (e.g. MNI152). "
        "Help \u203a Keyboard Shortcuts lists the keys and mouse actions of the slice views.",
    ),
    (
        "Tissue maps[[Compute Tissue Maps]]",
        "A volume of a model that makes tissue maps (the shipped model) comes with its grey matter, white "
        "matter, CSF and ventricle maps. Any other brain volume (a NIfTI file, a vault scan, a bundle's volume) "
        "gets them from View \u203a Compute Tissue Maps: a classical segmentation on this computer, for T1w, T2w "
        "or FLAIR (found from the volume, or chosen under Tissue Map Contrast), in the background with Cancel. "
        "The tissue tool bar says where the shown volume's maps came from; Save As writes them beside it.",
    ),
    (
        "Anatomy check",
        "The Session details end with the anatomy check of a volume that has tissue maps: first whether the "
        "maps look like a brain at all (\u2717 not brain-like, with the evidence), then brain volume (GM + WM), "
        "CSF fraction, GM share, ventricle volume and left-right asymmetry against published adult ranges "
        "(\u2713 within, \u26a0 outside range; the sources are in the volume's sidecar). Every volume names its "
        "space: a volume on the MNI152 template's grid (the shipped model's) is larger than the brain it "
        "stands for, so its mL are MNI152 mL, its ranges are scaled to that space, and the details give the "
        "native equivalent. The Generate panel's Brain volume is in the same MNI152 mL, and it says which "
        "values lie below the adult range before you generate them (the model was trained on smaller brains "
        "too).",
    ),
    (
        "Metrics",
        "Live CPU, memory and (with an NVIDIA GPU) GPU use, the app's own share next to the machine's, "
        "with a mark where each generation started and ended and a summary of the last run.",
    ),
    (
        "Vault",
        "An encrypted store for patient scans and generated volumes. Unlock it with its passphrase; import, "
        "view and export (optionally de-identified) from its dock.",
    ),
    (
        "Compare Settings[[Compare Settings...]]",
        "Runs the Generate panel's request twice, A then B, on the same seed, and shows both volumes, "
        "their difference, the speed ratio, memory and the top operators. For ratios to quote, use "
        "`volsynth bench`.",
    ),
    (
        "Side by side (A | B)[[Side by side (A | B)]]",
        "View \u203a Layout: the shown volume (A) above another volume of the session (B), plane by plane: a "
        "scan from the vault next to a synthetic volume, say. Choose B in the bar above the views; the Blend "
        "slider lays B over A's views (3D Slicer's foreground over background). One crosshair is linked in "
        "millimetres where both volumes name one template space (MNI152); where they do not, the bar says so "
        "and the views are linked centre to centre, not by anatomy. A scan whose header says only that it is "
        "aligned to a template (nilearn's MNI152 files) can be declared MNI152 there (Declare A MNI152), and is "
        "then linked by millimetres. A's views name what is blended over them in their corner (B 40%), with "
        "the SYNTHETIC mark when B is synthetic. Each keeps its own window/level and zoom.",
    ),
    (
        "Presets and Measure now[[Measure Settings on This Machine...]]",
        "The Optimization section's presets: Exact fp32 (the reference every speed is measured against), "
        "Fast (GPU), Low memory, Fast decode (CPU), and Fastest here once measured. Measure now runs each "
        "setting against fp32 on this machine for the selected model (about 2 minutes) and keeps the table; "
        "Fastest here is then the fastest setting whose volume stays above the PSNR floor you set. A speed-up "
        "measured on one machine is not a promise on another, and a quantization chosen for one model is "
        "turned off when you switch to another.",
    ),
    (
        "Step caching",
        "An Optimization setting: a full U-Net pass every k steps, the steps between reuse its deep features "
        "(level: how many top levels they recompute; the cached features held from the last full pass or "
        "forecast from the last two). Faster, not exact. A volume made with it is named in the session as "
        "Compare names the setting (cache:k3-l1-f: every 3 steps, level 1, forecast); Measure now and Quality "
        "over Seeds say what it costs.",
    ),
    (
        "Quality over Seeds",
        "A tab of Compare Settings: Compute Quality Report runs fp32 on two sets of seeds (how much volumes "
        "differ from seed to seed: the noise floor) and A's and B's settings on the first set, then plots the "
        "GM, WM and CSF volumes of every seed and its PSNR against fp32. Each setting is judged within "
        "seed-to-seed variation, or shifting the distribution (and what moved).",
    ),
    (
        "Get Models[[Get Models...]]",
        "Generate \u203a Get Models fetches NVIDIA's NV-Generate-MR-Brain or MONAI's brain latent-diffusion "
        "model from their hubs: each with its download size, what it needs on this computer and its licence, "
        "which you accept before anything is fetched. Cancel keeps what was fetched and Resume goes on from "
        "there; Add from Folder installs a copy brought on a disk. A finished model is selected in the model "
        "picker, and the status bar says what the switch of model reset.",
    ),
    (
        "Model folders[[Open Model Folder...]]",
        "Generate \u203a Open Model Folder opens a model folder (weights, model card, spec), a MONAI bundle "
        "(configs/inference.json, models/*.pt) or an NV-Generate-MR-Brain (MAISI) folder. A model that makes "
        "several contrasts shows Modality and Output size in the Generate panel; a volume's session name and "
        "details say which contrast it is. Help \u203a About shows the model card.",
    ),
    (
        "Cohorts[[Cohort...]]",
        "Generate \u203a Cohort makes many volumes with the Generate panel's model, sampler, steps, guidance, "
        "modality, output size and optimization settings: each condition at its default, fixed, on a grid or "
        "drawn from a distribution, times a number of seeds. It writes a BIDS-derivative folder "
        "(sub-*/anat/*_T1w.nii.gz, or the chosen contrast's suffix, with sidecars, participants.tsv and a "
        "manifest, so running it again on the folder resumes). It runs on a local Ray runtime, or a cluster "
        "by address; open a finished volume or a montage of a sample from the dialog.",
    ),
    (
        "Engine servers[[Connect to Engine Server...]]",
        "Connect to a `volsynth serve` machine (a GPU server): it appears as a device in the Generate panel. "
        "A server started with `--device xla` runs the networks as float32 XLA programs at its "
        "--xla-precision: torch optimization settings are not sent to it (the Optimization section says what "
        "runs there) and are kept for the next torch device.",
    ),
    (
        "Plan view[[Plan Multi-Device Run...]]",
        "With an XLA engine server connected, Generate \u203a Plan Multi-Device Run costs the ways to split a "
        "run over its devices for a TPU topology, compiles the best few and lists each with its predicted step "
        "time. Use this plan makes the next run use it (the Generate panel shows the plan; its \u00d7 clears "
        "it); the view says when one chip unsplit is faster.",
    ),
)


def _with_keys(text: str, keys: dict[str, str]) -> str:
    """Replace each ``[[Action text]]`` with " (its keys)" as the window has them now, or nothing."""
    return re.sub(r"\[\[([^\]]+)\]\]", lambda m: f" ({keys[m[1]]})" if keys.get(m[1]) else "", text)


def _code(escaped: str) -> str:
    """`volsynth bench` in the guide's texts as code, not with its backticks showing."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped)


def guide_html(window: QWidget) -> str:
    """The user guide as HTML: what each panel does, where files go. Keys are read from the window's actions."""
    keys = {row.what: row.keys for row in action_shortcuts(window)}
    return _with_keys(_guide_html(window), keys)


def _guide_html(window: QWidget) -> str:
    parts = ["<h2>VolSynth Studio in brief</h2>"]
    parts.append(
        f"<p style='color:#b45309'><b>{html.escape(INTENDED_USE_HEADLINE)}</b></p>"
        f"<p>{html.escape(INTENDED_USE_TEXT)}</p>"
    )
    parts.append(
        "<p>VolSynth Studio generates synthetic 3D MRI volumes with diffusion models and lets you inspect, "
        "keep and export them. Every generated volume is marked <b>SYNTHETIC</b> in its files.</p>"
    )
    parts.append("<h3>What each part of the window does</h3><dl>")
    for title, text in GUIDE_PANELS:
        parts.append(f"<dt><b>{html.escape(title)}</b></dt><dd>{_code(html.escape(text))}</dd>")
    parts.append("</dl><h3>Where files go</h3>")
    parts.append(
        "<p>Save As NIfTI[[Save As NIfTI...]] writes the volume where you choose, with a <code>.json</code> sidecar "
        "holding its provenance (model, seed, settings, device), and its tissue maps beside it "
        "(<code>…_label-GM_probseg.nii.gz</code>...), which open with it again. The app itself keeps:</p><dl>"
    )
    for what, where, note in user_folders(window):
        parts.append(
            f"<dt><b>{html.escape(what)}</b>: <code>{html.escape(str(where))}</code></dt>"
            f"<dd>{html.escape(note)}</dd>"
        )
    parts.append("</dl><h3>Keys</h3>")
    parts.append(
        "<p>Help \u203a Keyboard Shortcuts[[Keyboard Shortcuts]] lists every key of the menus as they are now, the "
        "slice views' keys and the mouse.</p>"
    )
    return "".join(parts)


class UserGuideDialog(QDialog):
    """Help > User Guide (F1)."""

    def __init__(self, window: QWidget) -> None:
        super().__init__(window)
        self.window_ = window
        self.setWindowTitle("User Guide \u2014 VolSynth Studio")
        self.setObjectName("userGuideDialog")
        self.browser = QTextBrowser()
        self.browser.setObjectName("userGuide")
        self.browser.setOpenLinks(False)
        self.search_edit = QLineEdit()
        self.search_edit.setObjectName("guideSearch")
        self.search_edit.setPlaceholderText("Find in the guide (Enter: next)")
        self.search_edit.setClearButtonEnabled(True)
        self.search_edit.textChanged.connect(self._on_search_edit_text_changed)
        self.search_edit.returnPressed.connect(self._on_search_edit_return_pressed)
        self.search_label = QLabel("")
        self.search_label.setObjectName("guideSearchCount")
        search = QHBoxLayout()
        search.addWidget(self.search_edit, 1)
        search.addWidget(self.search_label)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.close)
        # Enter belongs to the search field (the next match): a line edit passes Enter on to its dialog, which
        # pressed Close, the default button a dialog makes of its first push button.
        close = buttons.button(QDialogButtonBox.StandardButton.Close)
        close.setAutoDefault(False)
        close.setDefault(False)
        layout = QVBoxLayout(self)
        layout.addLayout(search)
        layout.addWidget(self.browser, 1)
        layout.addWidget(buttons)
        self.resize(680, 640)

    def refresh(self) -> None:
        self.browser.setHtml(guide_html(self.window_))
        self._find(from_start=True)

    def showEvent(self, event) -> None:  # noqa: N802 - Qt API
        super().showEvent(event)
        self.search_edit.setFocus()  # F1, then type what you look for

    def matches(self) -> int:
        """How many times the search text is in the guide (case-insensitive)."""
        text = self.search_edit.text()
        return self.browser.toPlainText().lower().count(text.lower()) if text else 0

    def _find(self, from_start: bool) -> None:
        text = self.search_edit.text()
        if from_start or not text:
            cursor = self.browser.textCursor()
            cursor.movePosition(QTextCursor.MoveOperation.Start)
            self.browser.setTextCursor(cursor)
        if not text:
            self.search_label.setText("")
            return
        found = self.browser.find(text)
        if not found and not from_start:  # past the last match: on from the top
            cursor = self.browser.textCursor()
            cursor.movePosition(QTextCursor.MoveOperation.Start)
            self.browser.setTextCursor(cursor)
            found = self.browser.find(text)
        if not found:
            self.search_label.setText("Not in the guide")
            return
        # Which match this is ("2 of 5"): the matches before the selection, in the text as the guide shows it.
        cursor = self.browser.textCursor()
        before = self.browser.toPlainText()[: cursor.selectionStart()].lower().count(text.lower())
        self.search_label.setText(f"{before + 1} of {self.matches()}")
        # The match a third of the way down, with what follows it in view (find() scrolls only as far as the
        # match's own line, which left it on the last line shown).
        bar = self.browser.verticalScrollBar()
        bar.setValue(bar.value() + self.browser.cursorRect().top() - self.browser.viewport().height() // 3)

    def _on_search_edit_text_changed(self, _text: str) -> None:
        self._find(from_start=True)

    def _on_search_edit_return_pressed(self) -> None:
        self._find(from_start=False)


class HelpMenu:
    """The Help menu's two entries and their dialogs (built on first use, kept for the next)."""

    def __init__(self, window: QWidget, menu: QMenu) -> None:
        self.window = window
        self.shortcuts_dialog: ShortcutsDialog | None = None
        self.guide_dialog: UserGuideDialog | None = None
        self.shortcuts_action = set_shortcut(QAction("&Keyboard Shortcuts", window), "help.shortcuts")
        self.shortcuts_action.setStatusTip("Every key of the menus, the slice views and the mouse")
        self.shortcuts_action.triggered.connect(self.show_shortcuts)
        self.guide_action = set_shortcut(QAction("&User Guide", window), "help.guide")
        self.guide_action.setStatusTip("What each panel does and where files go")
        self.guide_action.triggered.connect(self.show_guide)
        if menu.actions():
            first = menu.actions()[0]
            menu.insertAction(first, self.guide_action)
            menu.insertAction(first, self.shortcuts_action)
            menu.insertSeparator(first)
        else:
            menu.addAction(self.guide_action)
            menu.addAction(self.shortcuts_action)

    def show_shortcuts(self) -> ShortcutsDialog:
        if self.shortcuts_dialog is None:
            self.shortcuts_dialog = ShortcutsDialog(self.window)
        self.shortcuts_dialog.refresh()
        self._raise(self.shortcuts_dialog)
        return self.shortcuts_dialog

    def show_guide(self) -> UserGuideDialog:
        if self.guide_dialog is None:
            self.guide_dialog = UserGuideDialog(self.window)
        self.guide_dialog.refresh()
        self._raise(self.guide_dialog)
        return self.guide_dialog

    @staticmethod
    def _raise(dialog: QDialog) -> None:
        dialog.show()
        dialog.raise_()
        dialog.activateWindow()


class IntendedUseNotice(QToolBar):
    """The first-run statement of intended use: a bar across the top of the window until acknowledged.

    Non-modal on purpose (nothing is blocked while it is read); "I understand" hides it for good (a
    setting), and Help > About and the User Guide keep saying it.
    """

    def __init__(self, settings, parent: QWidget | None = None) -> None:
        super().__init__("Intended use", parent)
        self.setObjectName("intendedUseNotice")
        self.setMovable(False)
        self.settings = settings
        self.label = QLabel(f"<b>{html.escape(INTENDED_USE_HEADLINE)}</b> {html.escape(INTENDED_USE_TEXT)}")
        self.label.setObjectName("intendedUseText")
        self.label.setWordWrap(True)
        self.label.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.label.setMinimumWidth(720)  # two or three lines across the window, not a narrow column
        self.label.setStyleSheet("padding: 6px 10px; color: #92400e;")
        self.setStyleSheet(
            "QToolBar#intendedUseNotice { background: #fef3c7; border-bottom: 1px solid #f59e0b; }"
        )
        # Reachable without ~58 Tabs: it has the keyboard at the first start, Enter presses it there, and
        # Alt+U presses it from anywhere in the window.
        self.acknowledge_button = QPushButton("I &understand")
        self.acknowledge_button.setObjectName("intendedUseAcknowledge")
        self.acknowledge_button.setAutoDefault(True)  # Enter as well as Space while it has the focus
        self.acknowledge_button.setToolTip("Hide this statement for good (Alt+U); Help > About keeps it")
        self.acknowledge_button.clicked.connect(self._on_acknowledge_clicked)
        self.addWidget(self.label)
        self.addWidget(self.acknowledge_button)

    def showEvent(self, event) -> None:  # noqa: N802 - Qt API
        super().showEvent(event)
        if not getattr(self, "_focused_once", False):  # the window's first focus: read, then Enter
            self._focused_once = True
            self.acknowledge_button.setFocus(Qt.FocusReason.OtherFocusReason)

    def _on_acknowledge_clicked(self) -> None:
        self.settings.setValue(ACKNOWLEDGED_KEY, True)
        self.settings.sync()
        self.hide()
