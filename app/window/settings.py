"""What the main window remembers between runs (QSettings): its geometry and docks, the display choices,
the layout, the recent files and the generation form."""

from __future__ import annotations

import json

from app.core.session import CONVENTIONS, RENDER_PRESETS
from app.core.volumes import WINDOW_PRESETS
from app.viewer.viewer_area import DEFAULT_LAYOUT, LAYOUTS

FORM_KEY = "generation/form"


def restore_window_settings(window) -> None:
    """Put back what ``save_window_settings`` wrote (before the models load: a model's saved form values
    wait for it)."""
    s = window.settings
    state = window.state
    geometry = s.value("window/geometry")
    if geometry is not None:
        window.restoreGeometry(geometry)
    else:
        window.resize(1500, 920)
    dock_state = s.value("window/state")
    if dock_state is not None:
        window.restoreState(dock_state)
    window.files.restore_recent()
    convention = s.value("display/convention", "radiological", type=str)
    if convention in CONVENTIONS:
        state.convention = convention
    preset = s.value("display/window_preset", WINDOW_PRESETS[0], type=str)
    state.window_preset = preset if preset in WINDOW_PRESETS else WINDOW_PRESETS[0]
    render = s.value("display/render_preset", RENDER_PRESETS[0], type=str)
    if render in RENDER_PRESETS:
        state.render_preset = render
    state.smooth_display = s.value("display/smooth", True, type=bool)
    state.iso_fraction = s.value("display/iso_fraction", state.iso_fraction, type=float)
    state.set_tissue_opacity(s.value("display/tissue_opacity", state.tissue_opacity, type=float))
    state.set_tissue_choice(s.value("display/tissue_choice", state.tissue_choice, type=str))
    state.set_show_tissue(s.value("display/show_tissue", False, type=bool))
    state.set_show_crosshair(s.value("display/show_crosshair", True, type=bool))
    layout = s.value("display/layout", DEFAULT_LAYOUT, type=str)
    window.viewer.set_layout(layout if layout in LAYOUTS else DEFAULT_LAYOUT)
    window.viewer.view3d.sync_controls()
    window.viewer.view3d.preset_box.setCurrentText(state.render_preset)
    window.sync_view_menu()
    window.sync_window_presets()
    try:
        saved_form = json.loads(s.value(FORM_KEY, "{}", type=str))
    except (TypeError, ValueError):
        saved_form = {}
    state.form.restore(saved_form)  # before the models load: a model's saved values wait for it


def save_window_settings(window) -> None:
    s = window.settings
    state = window.state
    s.setValue("window/geometry", window.saveGeometry())
    s.setValue("window/state", window.saveState())
    if state.selected_model is not None:
        s.setValue("model/last", state.selected_model.id)
    s.setValue("display/convention", state.convention)
    s.setValue(
        "display/window_preset",
        state.window_preset if state.window_preset in WINDOW_PRESETS else WINDOW_PRESETS[0],
    )
    s.setValue("display/render_preset", state.render_preset)
    s.setValue("display/smooth", state.smooth_display)
    s.setValue("display/iso_fraction", state.iso_fraction)
    s.setValue("display/tissue_opacity", state.tissue_opacity)
    s.setValue("display/tissue_choice", state.tissue_choice)
    s.setValue("display/show_tissue", state.show_tissue)
    s.setValue("display/layout", window.viewer.layout_name)
    s.setValue("display/show_crosshair", state.show_crosshair)
    save_form(s, state.form)
    window.files.save_recent()
    s.sync()


def save_form(settings, form) -> None:
    """The generation form as it is now (saved on every edit, so a crash keeps what was typed)."""
    settings.setValue(FORM_KEY, json.dumps(form.to_dict()))
