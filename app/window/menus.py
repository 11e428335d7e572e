"""The main window's own actions, its menu bar (File, Generate, View, Help), its main tool bar and the
viewer's tool bars.

Each builder returns what it made as a typed object the window keeps (``WindowActions``, ``WindowMenuBar``,
``ViewerBars``); nothing here sets attributes on the window. ``WindowMenuBar.for_features`` is the
``WindowMenus`` features add their entries to (through ``AppServices.menus``); the keys of every action come
from ``app.services.shortcuts``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup
from PySide6.QtWidgets import QMenu

from app.core.intended_use import ACKNOWLEDGED_KEY
from app.core.session import CONVENTIONS, RENDER_PRESETS, AppState
from app.core.volumes import CUSTOM_PRESET, WINDOW_PRESETS
from app.generation import GenerationController
from app.services import AppServices, WindowMenus
from app.services.shortcuts import indexed, make_action
from app.viewer.tissue_compute import TissueMapsComputer, install_tissue_maps
from app.viewer.toolbar import ViewerToolbar, install_viewer_toolbar
from app.window.help import HelpMenu, IntendedUseNotice
from app.window.tool_bar_rows import ToolBarRows

CONVENTION_LABELS = {
    "radiological": "Radiological (patient right on screen left)",
    "neurological": "Neurological (patient right on screen right)",
}


@dataclass(frozen=True)
class WindowActions:
    """The main window's own actions (File, View, Help and Open Model Folder), built by ``build_actions`` and
    kept by the window as ``window_actions``; Generate's own come with the generation controller."""

    open: QAction
    save: QAction  # to the volume's file again once saved, else asks where
    save_as: QAction
    screenshot: QAction  # Save 3D Screenshot
    quit: QAction
    open_model: QAction  # Generate > Open Model Folder...
    reset_camera: QAction
    smooth: QAction  # View > Smooth Slice Display (checkable)
    about: QAction
    next_volume: QAction
    previous_volume: QAction
    window_presets: QActionGroup  # View > Window/Level Preset (checkable)
    conventions: QActionGroup  # View > Left/Right Convention (checkable, data: the convention)
    render_presets: QActionGroup  # View > 3D Rendering (checkable, data: the preset)


@dataclass(frozen=True)
class WindowMenuBar:
    """What ``build_menus`` made: the menus features add to, and the parts the window itself keeps."""

    for_features: WindowMenus
    panels: QMenu  # View > Panels: a toggle per dock
    help: HelpMenu  # User Guide (F1), Keyboard Shortcuts (Ctrl+/)
    intended_use_notice: IntendedUseNotice | None  # the first-run notice, None once acknowledged


@dataclass(frozen=True)
class ViewerBars:
    """The viewer's tool bar (with the tissue overlay's) and Compute Tissue Maps, from ``build_viewer_bars``."""

    toolbar: ViewerToolbar
    tissue_maps: TissueMapsComputer


def build_actions(window) -> WindowActions:
    """The File and View actions, and Open Model Folder (Generate's own come with the generation, placed by
    ``add_generation_actions``)."""
    smooth = make_action(window, "&Smooth Slice Display", window.set_smooth_display, "view.smooth")
    smooth.setCheckable(True)
    actions = WindowActions(
        open=make_action(
            window, "&Open NIfTI...", window.open_file_dialog, "file.open", "Open a NIfTI volume"
        ),
        # Slicer's and ITK-SNAP's convention: Save writes to the volume's file again once it has one (and
        # asks where only the first time); Save As always asks for a new file.
        save=make_action(
            window,
            "&Save",
            window.save_shown,
            "file.save",
            "Save the shown volume: to its file again once saved, else asks where (NIfTI + provenance sidecar)",
        ),
        save_as=make_action(
            window,
            "Save &As NIfTI...",
            window.save_file_dialog,
            "file.save_as",
            "Save the shown volume to a new NIfTI file with a provenance sidecar",
        ),
        screenshot=make_action(
            window,
            "Save 3D S&creenshot...",
            window.save_3d_screenshot_dialog,
            "file.screenshot_3d",
            "Save the 3D view as PNG",
        ),
        quit=make_action(window, "&Quit", window.close, "file.quit"),
        open_model=make_action(
            window,
            "Open &Model Folder...",
            window.open_model_folder_dialog,
            "generate.open_model",
            "Open a VolSynth model folder or MONAI bundle",
        ),
        reset_camera=make_action(window, "Reset 3D &Camera", window.reset_camera, "view.reset_camera"),
        smooth=smooth,
        about=make_action(window, "&About VolSynth Studio", window.show_about),
        next_volume=make_action(window, "Next Volume", partial(window.step_volume, 1), "view.next_volume"),
        previous_volume=make_action(
            window, "Previous Volume", partial(window.step_volume, -1), "view.previous_volume"
        ),
        **_view_preset_groups(window),
    )
    actions.save.setEnabled(False)
    actions.save_as.setEnabled(False)
    return actions


def build_menus(window, actions: WindowActions) -> WindowMenuBar:
    """File, Generate, View and Help; the Help menu's own entries and the first-run notice come with it; then
    the main tool bar (Open, Save), below the notice. Generate's own actions join later
    (``add_generation_actions``), the viewer's tool bars last (``build_viewer_bars``)."""
    bar = window.menuBar()
    file_menu = bar.addMenu("&File")
    file_menu.addAction(actions.open)
    file_menu.addMenu(window.files.recent_menu)
    file_menu.addAction(actions.save)
    file_menu.addAction(actions.save_as)
    file_menu.addAction(actions.screenshot)
    file_menu.addSeparator()
    file_menu.addAction(actions.quit)

    gen_menu = bar.addMenu("&Generate")  # features add their entries here (app/compare, app/remote)
    gen_menu.addAction(actions.open_model)

    view_menu = bar.addMenu("&View")  # the viewer tool bar's Tissue Overlay joins it (see build_viewer_bars)
    for title, group in (
        ("&Window/Level Preset", actions.window_presets),
        ("Left/Right Co&nvention", actions.conventions),
        ("3D &Rendering", actions.render_presets),
    ):
        view_menu.addMenu(title).addActions(group.actions())
    view_menu.addAction(actions.smooth)
    view_menu.addAction(actions.reset_camera)
    view_menu.addSeparator()
    view_menu.addAction(actions.previous_volume)
    view_menu.addAction(actions.next_volume)
    view_menu.addSeparator()
    panels_menu = view_menu.addMenu("&Panels")
    for dock in window.docks.values():
        panels_menu.addAction(dock.toggleViewAction())

    help_menu = bar.addMenu("&Help")
    help_menu.addAction(actions.about)
    help_entries = HelpMenu(window, help_menu)
    notice = add_intended_use_notice(window, window.settings)  # first run only
    window.files.rebuild_recent_menu()

    toolbar = window.addToolBar("Main")
    toolbar.setObjectName("mainToolbar")
    toolbar.setMovable(False)
    toolbar.addAction(actions.open)
    toolbar.addAction(actions.save)
    toolbar.addSeparator()
    menus = WindowMenus(
        menu_bar=bar,
        generate=gen_menu,
        view=view_menu,
        main_toolbar=toolbar,
        open_model_action=actions.open_model,
        add_window_action=window.addAction,
        add_fitted_tool_bars=ToolBarRows(window).add,
    )
    return WindowMenuBar(
        for_features=menus, panels=panels_menu, help=help_entries, intended_use_notice=notice
    )


def add_generation_actions(menus: WindowMenus, generation: GenerationController) -> None:
    """Generate, Cancel and Random Seed at the top of the Generate menu; Generate and Cancel on the main
    tool bar, after Open and Save."""
    menus.generate.insertActions(
        menus.open_model_action,
        [generation.generate_action, generation.cancel_action, generation.random_seed_action],
    )
    menus.main_toolbar.addAction(generation.generate_action)
    menus.main_toolbar.addAction(generation.cancel_action)


def _view_preset_groups(window) -> dict[str, QActionGroup]:
    """View > Window/Level Preset, Left/Right Convention and 3D Rendering: checkable groups."""
    window_presets = QActionGroup(window)
    for index, preset in enumerate((*WINDOW_PRESETS, CUSTOM_PRESET)):
        action = make_action(
            window,
            preset,
            partial(window.state.apply_window_preset, preset),
            indexed("view.window_preset", index),
        )
        action.setCheckable(True)
        window_presets.addAction(action)
    conventions = QActionGroup(window)
    for convention in CONVENTIONS:
        action = make_action(
            window, CONVENTION_LABELS[convention], partial(window.state.set_convention, convention)
        )
        action.setCheckable(True)
        action.setData(convention)
        conventions.addAction(action)
    render_presets = QActionGroup(window)
    for preset in RENDER_PRESETS:
        action = make_action(window, preset, partial(window.state.set_render_preset, preset))
        action.setCheckable(True)
        action.setData(preset)
        render_presets.addAction(action)
    return {"window_presets": window_presets, "conventions": conventions, "render_presets": render_presets}


def build_viewer_bars(viewer, services: AppServices, reset_camera: QAction) -> ViewerBars:
    """The viewer's tool bar and the tissue overlay's, after the main tool bar; their entries in View (the
    overlay's before ``reset_camera``, the layouts first)."""
    # Window/level, orientation, interpolation, crosshair, zoom, 4D time points: the viewer's tool bar
    toolbar = install_viewer_toolbar(services, viewer)
    view_menu = services.menus.view
    # The tissue overlay: on/off, map, opacity
    view_menu.insertAction(reset_camera, toolbar.tissue_toolbar.tissue_action)
    # Compute Tissue Maps (button, View menu, Ctrl+Shift+T)
    tissue_maps = install_tissue_maps(services, toolbar.tissue_toolbar)
    view_menu.insertMenu(view_menu.actions()[0], toolbar.layout_menu)
    return ViewerBars(toolbar=toolbar, tissue_maps=tissue_maps)


def add_intended_use_notice(window, settings) -> IntendedUseNotice | None:
    """The intended-use bar at the top of ``window`` on a row of its own, unless the user acknowledged it
    before."""
    if settings.value(ACKNOWLEDGED_KEY, False, type=bool):
        return None
    notice = IntendedUseNotice(settings, window)
    window.addToolBar(Qt.ToolBarArea.TopToolBarArea, notice)
    window.addToolBarBreak(Qt.ToolBarArea.TopToolBarArea)  # a row of its own: toolbars added later go below
    return notice


def sync_view_menu(actions: WindowActions, toolbar: ViewerToolbar, state: AppState) -> None:
    """Check the View menu's convention, rendering and smoothing entries (and the tool bar's convention box)
    as the display state has them."""
    toolbar.convention_box.setCurrentIndex(CONVENTIONS.index(state.convention))
    for action in actions.conventions.actions():
        action.setChecked(action.data() == state.convention)
    for action in actions.render_presets.actions():
        action.setChecked(action.data() == state.render_preset)
    actions.smooth.setChecked(state.smooth_display)


def sync_window_presets(actions: WindowActions, toolbar: ViewerToolbar, state: AppState) -> None:
    """Check the window/level preset the state has, in the View menu and the tool bar's box."""
    toolbar.preset_box.setCurrentText(state.window_preset)
    for action in actions.window_presets.actions():
        action.setChecked(action.text() == state.window_preset)
