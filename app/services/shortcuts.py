"""The app's one table of keyboard shortcuts (and mouse gestures): every action sets its keys from it, and
Help > Keyboard Shortcuts lists it, so the two cannot disagree.

An entry is ``action id -> Shortcut(keys, what, where)``. Entries whose ``where`` is a menu path (or the
session list) are ``QAction`` shortcuts: the code that makes the action calls ``set_shortcut(action, id)``
(or ``make_action(parent, text, slot, id)``), which sets the keys and tags the action with its id, so Help
and the tests find it. The others (``ACTION_FREE``) are keys a widget handles itself (the slice views' keys,
the Compare window's ``QShortcut``s) and mouse gestures; Help lists them as the table says.

Families (the window/level presets' Ctrl+1..., the layouts' Ctrl+Alt+1...) have one entry per member,
``"view.window_preset.1"`` and so on: ``indexed(id, index)`` names the member for a 0-based index.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence

ID_PROPERTY = "shortcutId"  # the QAction property that names the action's entry in SHORTCUTS


@dataclass(frozen=True)
class Shortcut:
    """One entry: the keys (a portable string or a platform ``StandardKey``), what they do, and where."""

    keys: str | QKeySequence.StandardKey
    what: str
    where: str  # a menu path ("File"), "Session list", or the widget the keys work in

    @property
    def sequence(self) -> QKeySequence:
        return QKeySequence(self.keys)

    def native_text(self) -> str:
        """The keys as this platform writes them (Help's Keys column); a widget's keys or a mouse gesture
        (``ACTION_FREE``) as the table writes them ("Up / Page Up", "Left drag")."""
        if self.where in ACTION_FREE:
            return str(self.keys)
        return self.sequence.toString(QKeySequence.SequenceFormat.NativeText)


SLICE_VIEWS = "Slice views"
SLICE_VIEWS_MOUSE = "Slice views (mouse)"
VIEW3D_MOUSE = "3D view (mouse)"
COMPARE_WINDOW = "Compare Settings window"
# Entries that are not QAction shortcuts: Help lists them from here, nothing calls set_shortcut for them.
ACTION_FREE = (SLICE_VIEWS, SLICE_VIEWS_MOUSE, VIEW3D_MOUSE, COMPARE_WINDOW)

WINDOW_PRESET_COUNT = 5  # app.core.volumes: the four WINDOW_PRESETS and Custom (tests check the count)
LAYOUT_COUNT = 5  # app.viewer.viewer_area.LAYOUTS (tests check the count)

_Std = QKeySequence.StandardKey

SHORTCUTS: dict[str, Shortcut] = {
    # File
    "file.open": Shortcut(_Std.Open, "Open NIfTI...", "File"),
    # Slicer's and ITK-SNAP's convention: Save writes to the volume's file again once it has one.
    "file.save": Shortcut(_Std.Save, "Save", "File"),
    "file.save_as": Shortcut("Ctrl+Shift+S", "Save As NIfTI...", "File"),
    "file.screenshot_3d": Shortcut("Ctrl+Shift+P", "Save 3D Screenshot...", "File"),
    "file.quit": Shortcut(_Std.Quit, "Quit", "File"),
    # Generate
    "generate.run": Shortcut("Ctrl+G", "Generate", "Generate"),
    "generate.cancel": Shortcut("Esc", "Cancel Generation", "Generate"),
    "generate.random_seed": Shortcut("Ctrl+R", "Random Seed", "Generate"),
    "generate.open_model": Shortcut("Ctrl+Shift+O", "Open Model Folder...", "Generate"),
    "generate.compare": Shortcut("Ctrl+Shift+G", "Compare Settings...", "Generate"),
    "generate.connect_server": Shortcut("Ctrl+Shift+E", "Connect to Engine Server...", "Generate"),
    "generate.plan": Shortcut("Ctrl+Shift+L", "Plan Multi-Device Run...", "Generate"),
    "generate.cohort": Shortcut("Ctrl+Shift+H", "Cohort...", "Generate"),
    "generate.measure": Shortcut("Ctrl+Shift+M", "Measure Settings on This Machine...", "Generate"),
    # View
    **{
        f"view.window_preset.{n}": Shortcut(
            f"Ctrl+{n}", f"Window/level preset {n}", "View \u203a Window/Level Preset"
        )
        for n in range(1, WINDOW_PRESET_COUNT + 1)
    },
    **{
        f"view.layout.{n}": Shortcut(f"Ctrl+Alt+{n}", f"Layout {n}", "View \u203a Layout")
        for n in range(1, LAYOUT_COUNT + 1)
    },
    "view.smooth": Shortcut("Ctrl+I", "Smooth Slice Display", "View"),
    "view.tissue_overlay": Shortcut("Ctrl+T", "Tissue Overlay", "View"),
    "view.compute_tissue_maps": Shortcut("Ctrl+Shift+T", "Compute Tissue Maps", "View"),
    "view.reset_camera": Shortcut("Ctrl+0", "Reset 3D Camera", "View"),
    "view.previous_volume": Shortcut("Ctrl+[", "Previous Volume", "View"),
    "view.next_volume": Shortcut("Ctrl+]", "Next Volume", "View"),
    "view.crosshair": Shortcut("Ctrl+Shift+X", "Crosshair", "Viewer tool bar"),
    # Vault (app/vault/browser.py's menu)
    "vault.lock": Shortcut("Ctrl+L", "Lock Vault", "Vault"),
    "vault.show_browser": Shortcut("Ctrl+Shift+V", "Show Vault Browser", "Vault"),
    # Help
    "help.shortcuts": Shortcut("Ctrl+/", "Keyboard Shortcuts", "Help"),
    "help.guide": Shortcut(
        _Std.HelpContents, "User Guide", "Help"
    ),  # F1 on Windows and Linux, Ctrl+? on macOS
    # The session list (its keys work while it has the focus)
    "session.remove": Shortcut(_Std.Delete, "Remove from Session", "Session list"),
    "session.rename": Shortcut("F2", "Rename", "Session list"),
    # Keys a slice view handles itself (app/viewer/slice_view.py keyPressEvent); tests/app/window/test_help.py sends
    # each one to a real slice view and fails if the view ignores it.
    "slice.next": Shortcut("Up / Page Up", "Next slice", SLICE_VIEWS),
    "slice.previous": Shortcut("Down / Page Down", "Previous slice", SLICE_VIEWS),
    "slice.first_last": Shortcut("Home / End", "First / last slice", SLICE_VIEWS),
    "slice.zoom_in": Shortcut("+ / =", "Zoom in", SLICE_VIEWS),
    "slice.zoom_out": Shortcut("- / _", "Zoom out", SLICE_VIEWS),
    "slice.reset_zoom": Shortcut("0", "Reset zoom and pan", SLICE_VIEWS),
    "slice.mouse.crosshair": Shortcut(
        "Left click or drag", "Move the crosshair (all views follow)", SLICE_VIEWS_MOUSE
    ),
    "slice.mouse.window": Shortcut(
        "Right drag", "Window (left-right) and level (up-down)", SLICE_VIEWS_MOUSE
    ),
    "slice.mouse.pan": Shortcut("Middle drag or Shift+left drag", "Pan", SLICE_VIEWS_MOUSE),
    "slice.mouse.wheel": Shortcut("Wheel", "Next / previous slice", SLICE_VIEWS_MOUSE),
    "slice.mouse.zoom": Shortcut("Ctrl+wheel", "Zoom about the pointer", SLICE_VIEWS_MOUSE),
    "slice.mouse.maximise": Shortcut(
        "Double-click", "Maximise this view; again to restore", SLICE_VIEWS_MOUSE
    ),
    # The 3D view's mouse (VTK's trackball camera, which pyvista's QtInteractor uses).
    "view3d.mouse.rotate": Shortcut("Left drag", "Rotate the volume", VIEW3D_MOUSE),
    "view3d.mouse.pan": Shortcut("Shift+left drag or middle drag", "Pan", VIEW3D_MOUSE),
    "view3d.mouse.zoom": Shortcut("Right drag or wheel", "Zoom", VIEW3D_MOUSE),
    "view3d.mouse.roll": Shortcut("Ctrl+left drag", "Roll (spin about the view axis)", VIEW3D_MOUSE),
    # The Compare Settings window's QShortcuts (app/compare/window.py makes them from RUN_KEY, CANCEL_KEY
    # and the plane numbers; tests/app/window/test_shortcuts.py checks these entries against those values).
    "compare.run": Shortcut("Ctrl+Return", "Run the comparison", COMPARE_WINDOW),
    "compare.cancel": Shortcut("Esc", "Cancel it at the next step", COMPARE_WINDOW),
    "compare.planes": Shortcut("1 / 2 / 3", "Axial / coronal / sagittal in all three views", COMPARE_WINDOW),
}


def indexed(family: str, index: int) -> str:
    """The id of a family's member for a 0-based ``index``: ``indexed("view.layout", 0) == "view.layout.1"``."""
    return f"{family}.{index + 1}"


def keys(shortcut_id: str) -> QKeySequence:
    """The key sequence of ``shortcut_id`` (a KeyError for an id the table lacks: a typo fails at once)."""
    return SHORTCUTS[shortcut_id].sequence


def key_text(shortcut_id: str) -> str:
    """The keys of ``shortcut_id`` as this platform writes them, for tooltips and messages ("Ctrl+T")."""
    return SHORTCUTS[shortcut_id].native_text()


def set_shortcut(
    action: QAction, shortcut_id: str, context: Qt.ShortcutContext = Qt.ShortcutContext.WindowShortcut
) -> QAction:
    """Give ``action`` the table's keys for ``shortcut_id`` (window-wide by default) and tag it with the id."""
    action.setShortcut(keys(shortcut_id))
    action.setShortcutContext(context)
    action.setProperty(ID_PROPERTY, shortcut_id)
    return action


def make_action(parent, text: str, slot, shortcut_id: str | None = None, tip: str = "") -> QAction:
    """A window-wide action whose tooltip names its shortcut (Help > Keyboard Shortcuts lists them)."""
    action = QAction(text, parent)
    if shortcut_id is not None:
        set_shortcut(action, shortcut_id)
    if tip:
        action.setStatusTip(tip)
        action.setToolTip(f"{tip} ({action.shortcut().toString()})" if shortcut_id else tip)
    action.triggered.connect(slot)
    return action


def listed_without_action() -> list[tuple[str, Shortcut]]:
    """The entries no QAction carries (widget keys, mouse gestures), in table order."""
    return [(sid, entry) for sid, entry in SHORTCUTS.items() if entry.where in ACTION_FREE]
