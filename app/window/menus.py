"""The main window's own actions, its menu bar (File, Generate, View, Help), its main tool bar and the
viewer's tool bars.

``build_menus`` returns the ``WindowMenus`` features add their entries to (through ``AppServices.menus``);
the keys of every action come from ``app.services.shortcuts``.
"""

from __future__ import annotations

from functools import partial

from PySide6.QtCore import Qt
from PySide6.QtGui import QActionGroup

from app.core.intended_use import ACKNOWLEDGED_KEY
from app.core.session import CONVENTIONS, RENDER_PRESETS
from app.core.volumes import CUSTOM_PRESET, WINDOW_PRESETS
from app.generation import GenerationController
from app.services import AppServices, WindowMenus
from app.services.shortcuts import indexed, make_action
from app.viewer.tissue_compute import install_tissue_maps
from app.viewer.toolbar import install_viewer_toolbar
from app.window.help import HelpMenu, IntendedUseNotice
from app.window.tool_bar_rows import ToolBarRows

CONVENTION_LABELS = {
    "radiological": "Radiological (patient right on screen left)",
    "neurological": "Neurological (patient right on screen right)",
}


def build_actions(window) -> None:
    """The File and View actions, and Open Model Folder (Generate's own come with the generation, placed by
    ``add_generation_actions``)."""
    window.open_action = make_action(
        window, "&Open NIfTI...", window.open_file_dialog, "file.open", "Open a NIfTI volume"
    )
    # Slicer's and ITK-SNAP's convention: Save writes to the volume's file again once it has one (and
    # asks where only the first time); Save As always asks for a new file.
    window.save_action = make_action(
        window,
        "&Save",
        window.save_shown,
        "file.save",
        "Save the shown volume: to its file again once saved, else asks where (NIfTI + provenance sidecar)",
    )
    window.save_action.setEnabled(False)
    window.save_as_action = make_action(
        window,
        "Save &As NIfTI...",
        window.save_file_dialog,
        "file.save_as",
        "Save the shown volume to a new NIfTI file with a provenance sidecar",
    )
    window.save_as_action.setEnabled(False)
    window.screenshot_action = make_action(
        window,
        "Save 3D S&creenshot...",
        window.save_3d_screenshot_dialog,
        "file.screenshot_3d",
        "Save the 3D view as PNG",
    )
    window.quit_action = make_action(window, "&Quit", window.close, "file.quit")
    window.open_model_action = make_action(
        window,
        "Open &Model Folder...",
        window.open_model_folder_dialog,
        "generate.open_model",
        "Open a VolSynth model folder or MONAI bundle",
    )
    window.reset_camera_action = make_action(
        window, "Reset 3D &Camera", window.reset_camera, "view.reset_camera"
    )
    window.smooth_action = make_action(
        window, "&Smooth Slice Display", window.set_smooth_display, "view.smooth"
    )
    window.smooth_action.setCheckable(True)
    window.about_action = make_action(window, "&About VolSynth Studio", window.show_about)
    window.next_volume_action = make_action(
        window, "Next Volume", partial(window.step_volume, 1), "view.next_volume"
    )
    window.prev_volume_action = make_action(
        window, "Previous Volume", partial(window.step_volume, -1), "view.previous_volume"
    )


def build_menus(window) -> WindowMenus:
    """File, Generate, View and Help; the Help menu's own entries and the first-run notice come with it; then
    the main tool bar (Open, Save), below the notice. Generate's own actions join later
    (``add_generation_actions``), the viewer's tool bars last (``build_viewer_bars``)."""
    bar = window.menuBar()
    file_menu = bar.addMenu("&File")
    file_menu.addAction(window.open_action)
    window.recent_menu = window.files.recent_menu
    file_menu.addMenu(window.recent_menu)
    file_menu.addAction(window.save_action)
    file_menu.addAction(window.save_as_action)
    file_menu.addAction(window.screenshot_action)
    file_menu.addSeparator()
    file_menu.addAction(window.quit_action)

    gen_menu = bar.addMenu("&Generate")
    window.generate_menu = gen_menu  # features add their entries here (app/compare, app/remote)
    gen_menu.addAction(window.open_model_action)

    view_menu = bar.addMenu("&View")
    _build_view_presets(window, view_menu)
    view_menu.addAction(window.smooth_action)
    window.view_menu = view_menu  # the viewer tool bar's Tissue Overlay joins it (see build_viewer_bars)
    view_menu.addAction(window.reset_camera_action)
    view_menu.addSeparator()
    view_menu.addAction(window.prev_volume_action)
    view_menu.addAction(window.next_volume_action)
    view_menu.addSeparator()
    window.panels_menu = view_menu.addMenu("&Panels")
    for dock in window.docks.values():
        window.panels_menu.addAction(dock.toggleViewAction())

    help_menu = bar.addMenu("&Help")
    help_menu.addAction(window.about_action)
    window.help = HelpMenu(window, help_menu)  # User Guide (F1), Keyboard Shortcuts (Ctrl+/)
    window.intended_use_notice = add_intended_use_notice(window, window.settings)  # first run only
    window.files.rebuild_recent_menu()

    toolbar = window.addToolBar("Main")
    toolbar.setObjectName("mainToolbar")
    window.main_toolbar = toolbar
    toolbar.setMovable(False)
    toolbar.addAction(window.open_action)
    toolbar.addAction(window.save_action)
    toolbar.addSeparator()
    return WindowMenus(
        menu_bar=bar,
        generate=gen_menu,
        view=view_menu,
        main_toolbar=toolbar,
        open_model_action=window.open_model_action,
        add_window_action=window.addAction,
        add_fitted_tool_bars=ToolBarRows(window).add,
    )


def add_generation_actions(window, generation: GenerationController) -> None:
    """Generate, Cancel and Random Seed at the top of the Generate menu; Generate and Cancel on the main
    tool bar, after Open and Save."""
    window.generate_action = generation.generate_action
    window.cancel_action = generation.cancel_action
    window.random_seed_action = generation.random_seed_action
    window.generate_menu.insertActions(
        window.open_model_action,
        [window.generate_action, window.cancel_action, window.random_seed_action],
    )
    window.main_toolbar.addAction(window.generate_action)
    window.main_toolbar.addAction(window.cancel_action)


def _build_view_presets(window, view_menu) -> None:
    """View > Window/Level Preset, Left/Right Convention and 3D Rendering: checkable groups."""
    wl_menu = view_menu.addMenu("&Window/Level Preset")
    window.wl_group = QActionGroup(window)
    for index, preset in enumerate((*WINDOW_PRESETS, CUSTOM_PRESET)):
        action = make_action(
            window,
            preset,
            partial(window.state.apply_window_preset, preset),
            indexed("view.window_preset", index),
        )
        action.setCheckable(True)
        window.wl_group.addAction(action)
        wl_menu.addAction(action)
    conv_menu = view_menu.addMenu("Left/Right Co&nvention")
    window.convention_group = QActionGroup(window)
    for convention in CONVENTIONS:
        action = make_action(
            window, CONVENTION_LABELS[convention], partial(window.state.set_convention, convention)
        )
        action.setCheckable(True)
        action.setData(convention)
        window.convention_group.addAction(action)
        conv_menu.addAction(action)
    render_menu = view_menu.addMenu("3D &Rendering")
    window.render_group = QActionGroup(window)
    for preset in RENDER_PRESETS:
        action = make_action(window, preset, partial(window.state.set_render_preset, preset))
        action.setCheckable(True)
        action.setData(preset)
        window.render_group.addAction(action)
        render_menu.addAction(action)


def build_viewer_bars(window, services: AppServices) -> None:
    """The viewer's tool bar and the tissue overlay's, after the main tool bar; their entries in View."""
    # Window/level, orientation, interpolation, crosshair, zoom, 4D time points: the viewer's tool bar
    window.viewer_toolbar = install_viewer_toolbar(services, window.viewer)
    window.wl_box = window.viewer_toolbar.preset_box
    window.convention_box = window.viewer_toolbar.convention_box
    window.tissue_toolbar = window.viewer_toolbar.tissue_toolbar  # the tissue overlay: on/off, map, opacity
    window.view_menu.insertAction(window.reset_camera_action, window.tissue_toolbar.tissue_action)
    # Compute Tissue Maps (button, View menu, Ctrl+Shift+T)
    window.tissue_maps = install_tissue_maps(services, window.tissue_toolbar)
    window.view_menu.insertMenu(window.view_menu.actions()[0], window.viewer_toolbar.layout_menu)
    window.layout_actions = window.viewer_toolbar.layout_group.actions()


def add_intended_use_notice(window, settings) -> IntendedUseNotice | None:
    """The intended-use bar at the top of ``window`` on a row of its own, unless the user acknowledged it
    before."""
    if settings.value(ACKNOWLEDGED_KEY, False, type=bool):
        return None
    notice = IntendedUseNotice(settings, window)
    window.addToolBar(Qt.ToolBarArea.TopToolBarArea, notice)
    window.addToolBarBreak(Qt.ToolBarArea.TopToolBarArea)  # a row of its own: toolbars added later go below
    return notice


def sync_view_menu(window) -> None:
    """Check the View menu's convention, rendering and smoothing entries (and the tool bar's convention box)
    as the display state has them."""
    state = window.state
    window.convention_box.setCurrentIndex(CONVENTIONS.index(state.convention))
    for action in window.convention_group.actions():
        action.setChecked(action.data() == state.convention)
    for action in window.render_group.actions():
        action.setChecked(action.data() == state.render_preset)
    window.smooth_action.setChecked(state.smooth_display)


def sync_window_presets(window) -> None:
    """Check the window/level preset the state has, in the View menu and the tool bar's box."""
    window.wl_box.setCurrentText(window.state.window_preset)
    for action in window.wl_group.actions():
        action.setChecked(action.text() == window.state.window_preset)
