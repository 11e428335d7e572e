"""Ctrl+wheel zoom from real X wheel events (XTest button 4, as xdotool sends them): one event and one
ZOOM_STEP per notch, nothing more, and the zoom level is shown on the view. The viewer on ``AppServices``
(tests/app/viewer/rig.py)."""

from __future__ import annotations

import ctypes
import ctypes.util

import pytest
from PySide6.QtGui import QGuiApplication

from app.core.slicing import ZOOM_STEP

pytestmark = pytest.mark.render
XK_CONTROL_L = 0xFFE3
WHEEL_UP = 4


def _xtest():
    if QGuiApplication.platformName() != "xcb":
        pytest.skip("needs the xcb platform (X11 wheel events)")
    x11, xtst = ctypes.util.find_library("X11"), ctypes.util.find_library("Xtst")
    if not (x11 and xtst):
        pytest.skip("libX11/libXtst are not installed")
    x11, xtst = ctypes.CDLL(x11), ctypes.CDLL(xtst)
    x11.XOpenDisplay.restype = ctypes.c_void_p
    display = x11.XOpenDisplay(None)
    if not display:
        pytest.skip("cannot open the X display")
    return x11, xtst, ctypes.c_void_p(display)


def test_five_real_ctrl_wheel_notches_zoom_by_five_steps(qtbot, viewer_rig, mni_t1, screenshot):
    window = viewer_rig.host
    viewer_rig.open(qtbot, mni_t1)
    axial = viewer_rig.viewer.axial
    events = []
    original = axial.wheelEvent

    def record(event):
        events.append(event.angleDelta().y())
        original(event)

    axial.wheelEvent = record
    x11, xtst, display = _xtest()
    centre = axial.mapToGlobal(axial.rect().center())
    xtst.XTestFakeMotionEvent(display, -1, centre.x(), centre.y(), 0)
    ctrl = x11.XKeysymToKeycode(display, XK_CONTROL_L)
    xtst.XTestFakeKeyEvent(display, ctrl, 1, 0)
    for _ in range(5):
        xtst.XTestFakeButtonEvent(display, WHEEL_UP, 1, 0)
        xtst.XTestFakeButtonEvent(display, WHEEL_UP, 0, 0)
    xtst.XTestFakeKeyEvent(display, ctrl, 0, 0)
    x11.XFlush(display)
    qtbot.waitUntil(lambda: len(events) >= 5, timeout=10_000)
    x11.XCloseDisplay(display)
    assert events == [120] * 5  # one event per notch: no doubled delivery
    assert axial.zoom == pytest.approx(ZOOM_STEP**5)  # 2.0x for 1.15, not the ~13x reported
    shown = {item.name: item.text for item in axial.overlay_layout()}
    assert shown["slice"].endswith(f"{ZOOM_STEP**5 * 100:.0f}%")
    screenshot(window, "zoom-after-five-ctrl-wheel-notches")
