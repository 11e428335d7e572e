"""The Generate form's conditioning alone (app/panels/sampling_panel.py): a volume input of a model on the MNI152
grid says which space its number is in, and a value the anatomy check would flag says why before it is asked for."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from tests.app.keys import type_into

pytestmark = pytest.mark.render


def _type(qtbot, spin, text: str) -> None:
    """Click into the spin box's field (it takes the focus), type ``text``, leave with Tab."""
    spin.setFocus()
    qtbot.waitUntil(spin.hasFocus, timeout=5_000)
    type_into(qtbot, spin, text)


@pytest.fixture
def tissue_panel(qtbot, themed_app, tiny_models_dir, tissue_models_dir):
    """The Generate form alone, over the tiny tissue model (its output grid is MNI152's, as the shipped one's)."""
    from app.core.session import AppState
    from app.panels.sampling_panel import SamplingPanel
    from engine.models.registry import ModelRegistry

    state = AppState()
    state.set_models(ModelRegistry([tiny_models_dir, tissue_models_dir]).list(), preferred="tiny-tissue")
    panel = SamplingPanel(state)
    qtbot.addWidget(panel)
    panel.resize(420, 900)
    panel.show()
    qtbot.waitExposed(panel)
    panel.activateWindow()  # typed keys and focus go to the active window only
    qtbot.waitUntil(panel.isActiveWindow, timeout=5_000)
    return panel


def test_brain_volume_says_its_space_and_why_the_check_will_flag_a_small_brain(
    qtbot, tissue_panel, screenshot
):
    from engine.anatomy.norms import space_scale

    panel = tissue_panel
    assert panel.state.selected_model.spec.space == "MNI152NLin2009aSym"
    control = panel.condition_controls["brain_volume"]
    scale = space_scale("MNI152NLin2009aSym")
    _type(qtbot, control.spin, "1400")
    assert panel.form.conditioning["brain_volume"] == 1400
    assert control.space_hint.isVisible()
    assert control.space_hint.text() == f"MNI152 mL \u00b7 \u2248 {1400 / scale:.0f} mL native"
    assert not control.note.isVisible()  # within the adult range: nothing to warn of

    _type(qtbot, control.spin, "1000")  # offered by the slider, below the adult range
    assert control.space_hint.text() == f"MNI152 mL \u00b7 \u2248 {1000 / scale:.0f} mL native"
    assert control.note.isVisible()
    note = control.note.text()
    assert note.startswith("Below the adult range (1201-2156 MNI152 mL, 881-1582 mL native, Matsumae 1996)")
    assert note.endswith("the anatomy check flags such a brain")
    screenshot(panel, "generate-form-brain-volume-1000-mni152-ml")

    # Ventricles: above the adult range is said too, in the same words.
    ventricles = panel.condition_controls["ventricle_volume"]
    _type(qtbot, ventricles.spin, "80")
    assert ventricles.space_hint.text().startswith("MNI152 mL \u00b7 \u2248 ")
    assert not ventricles.note.isVisible()


def test_a_model_without_a_template_space_gets_no_space_hint(qtbot, tissue_panel):
    from tests.app.keys import pick

    panel = tissue_panel
    pick(qtbot, panel.model_box, "tiny-latent")  # no space: scanner millimetres
    control = panel.condition_controls["brain_volume"]
    _type(qtbot, control.spin, "1000")
    assert panel.form.conditioning["brain_volume"] == 1000
    assert not control.space_hint.isVisible() and control.space_hint.text() == ""
    # 1000 mL of a native brain is within the adult range (the same number on the MNI152 grid is not).
    assert not control.note.isVisible()


@pytest.fixture
def tiny_panel(qtbot, themed_app, registry):
    """The Generate form alone over the tiny test models (a conditioned latent one, an unconditioned pixel one)."""
    from app.core.session import AppState
    from app.panels.sampling_panel import SamplingPanel

    state = AppState()
    state.set_models(registry.list(), preferred="tiny-latent")
    panel = SamplingPanel(state)
    qtbot.addWidget(panel)
    panel.resize(420, 900)
    panel.show()
    qtbot.waitExposed(panel)
    panel.activateWindow()
    qtbot.waitUntil(panel.isActiveWindow, timeout=5_000)
    return panel


def _select(panel, model_id: str) -> None:
    panel.state.select_model(panel.state.model_by_id(model_id))


def test_conditioning_controls_follow_the_model_spec(tiny_panel):
    panel = tiny_panel
    _select(panel, "tiny-latent")
    assert set(panel.condition_controls) == {"brain_volume", "ventricle_volume"}
    control = panel.condition_controls["brain_volume"]
    assert "900 to 1500 mL" in control.spin.toolTip() and control.spin.suffix() == " mL"
    assert control.slider.toolTip() == control.spin.toolTip()  # slider and field state one range
    control.slider.setValue(1000)
    assert control.value() == 1500 and panel.state.form.conditioning["brain_volume"] == 1500
    assert panel.guidance_spin.isEnabled()
    _select(panel, "tiny-pixel")
    assert not panel.condition_controls and not panel.guidance_spin.isEnabled()
    assert not panel.conditioning_group.isVisible()


def test_typed_condition_above_the_maximum_is_clamped_visibly(qtbot, tiny_panel):
    panel = tiny_panel
    _select(panel, "tiny-latent")
    spin = panel.condition_controls["ventricle_volume"].spin
    spin.setFocus()
    spin.selectAll()
    qtbot.keyClicks(spin, "200")  # used to stop at "20": the field refused the third digit
    qtbot.keyClick(spin, Qt.Key.Key_Return)
    control = panel.condition_controls["ventricle_volume"]
    assert panel.state.form.conditioning["ventricle_volume"] == 80.0  # the maximum, not 20
    assert control.value() == 80.0
    assert control.note.isVisibleTo(panel) and "200 is outside 5 to 80: set to 80" in control.note.text()
