"""The overlay text of a slice view: which texts (title, tag, slice, window, orientation letters) at which
compactness, and where each box goes so that none overlaps another or leaves the view.

Functions of a ``SliceView`` (they read its state, plane, geometry, zoom, size and fonts) rather than its
methods, so the view's module holds drawing and interaction and this one the text layout.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QRectF
from PySide6.QtGui import QFontMetricsF

from app.core.slicing import AXIS_LETTERS, INDEX_BASE, format_fixed, zoom_percent

CONVENTION_SHORT = {"radiological": "radiol.", "neurological": "neuro."}


@dataclass(frozen=True)
class OverlayText:
    """One piece of overlay text: what it says and the box (backing included) it is drawn in."""

    name: str  # "title", "tag", "slice", "window" or "orientation-left/right/top/bottom"
    text: str
    rect: QRectF
    bold: bool = False


def preview_run_step(state, entry) -> int:
    """The run's denoising step while ``entry`` (a preview) is shown during it, else 0. Said whenever a run
    goes on, not only while it is past the image, so the tag keeps its length (and the overlay its layout)
    from one preview to the next."""
    progress = getattr(state, "progress", None)
    if progress is None or not entry.preview_step or progress.stage != "denoise" or not state.job_running:
        return 0
    return max(progress.step, entry.preview_step[0])


def corner_texts(view, level: int) -> dict[str, str]:
    """Title, tag, slice number and window at a compactness level (0 full .. 2 shortest)."""
    entry = view.state.shown
    texts = {"title": view.plane.capitalize()}
    if view.plane != "sagittal" and level == 0:
        texts["title"] += f" ({CONVENTION_SHORT[view.state.convention]})"
    if level == 2:
        texts["title"] = view.plane[:3].capitalize()
    if getattr(view, "label", ""):  # side by side: which of the two volumes this view shows
        texts["title"] = f"{view.label} \u00b7 {texts['title']}"
    if entry is None:
        return texts
    if entry.kind == "preview":  # which step the image is from: the bar may be a step or two further
        step = f" step {entry.preview_step[0]}/{entry.preview_step[1]}" if entry.preview_step else ""
        texts["tag"] = (
            f"PREVIEW{step} (x\u2080 estimate)"
            if level == 0
            else f"PREVIEW{step}"
            if level == 1
            else "PREVIEW"
        )
        # The run is often further on than this image (previews come every few steps, a slow decoder draws
        # them late): say where it is, so a still image does not read as a stalled run; a compact overlay
        # keeps only the ellipsis, a sign that the next image is on its way, and its room for the title.
        run = preview_run_step(view.state, entry)
        if run:
            texts["tag"] += f" \u00b7 run at step {run}\u2026" if level == 0 else "\u2026"
    else:
        tag = blend_tag(view, entry, level)
        if tag:
            texts["tag"] = tag
    ijk = view.state.crosshair_voxel()
    axis = view.geometry_.slice_axis
    index, last = ijk[axis] + INDEX_BASE, entry.shape[axis] - 1 + INDEX_BASE
    letter = AXIS_LETTERS[axis]
    texts["slice"] = (
        f"slice {letter}={index} ({INDEX_BASE}\u2013{last})"
        if level == 0
        else f"{letter}={index}/{last}"
        if level == 1
        else f"{letter}={index}"
    )
    if abs(view.zoom - 1.0) > 1e-6 and level < 2:  # the zoom level, once it is not "fit"
        texts["slice"] += f"  \u00b7  {zoom_percent(view.zoom)}"
    if level < 2:  # the toolbar shows W and L too: the first thing to go when space is short
        window, level_value = view.state.window
        decimals = entry.window_decimals  # as the W and L fields on the tool bar show them
        w, c = format_fixed(window, decimals), format_fixed(level_value, decimals)
        texts["window"] = f"W {w}  L {c}" if level == 0 else f"W{w} L{c}"
    return texts


def blend_tag(view, entry, level: int) -> str:
    """The corner tag of a view of ``entry`` (not a preview): SYNTHETIC for a synthetic volume, and what is
    blended over it, as Slicer names its foreground layer and opacity ("B over A 40%"). The mark stays at every
    compactness level whenever anything synthetic is drawn, the volume or the layer over it."""
    layer = view.foreground_layer() if getattr(view, "foreground_layer", None) is not None else None
    synthetic = bool(entry.synthetic) or bool(layer and layer[2])
    mark = "SYNTHETIC" if synthetic else ""
    if layer is None:
        return mark
    name, opacity = layer[0], f"{round(100 * layer[1])}%"
    blend = f"{name} over {view.label or 'this'} {opacity}" if level == 0 else f"{name} {opacity}"
    return (
        " \u00b7 ".join(p for p in (mark, blend) if p)
        if level < 2
        else " ".join(p for p in (mark, blend) if p)
    )


def overlay_layout(view) -> list[OverlayText]:
    """Overlay boxes: title top-left, tag top-right, slice bottom-left, window bottom-right, and the
    orientation letters at the middle of the visible image's edges, between those two rows.

    The most complete texts that fit side by side are used; shorter ones in small views.
    """
    font, bold = view.fonts()
    fm, fm_bold = QFontMetricsF(font), QFontMetricsF(bold)
    pad_x, pad_y, margin, gap = view.BOX_PAD_X, view.BOX_PAD_Y, view.TEXT_MARGIN, view.GAP
    width, height = float(view.width()), float(view.height())
    box_h = fm.height() + 2 * pad_y
    left_x = margin + 4  # the plane's colour strip is 4 px wide

    def box_w(text: str, metrics: QFontMetricsF = fm) -> float:
        return metrics.horizontalAdvance(text) + 2 * pad_x

    def row_fits(left: str | None, right: str | None) -> bool:
        used = (box_w(left) if left else 0) + (box_w(right) if right else 0) + gap
        return left_x + used <= width - margin

    # The top row (title, tag) and the bottom row (slice, window) each take the most complete texts
    # that fit side by side.
    levels = [corner_texts(view, level) for level in range(3)]
    top_row = next((x for x in levels if row_fits(x["title"], x.get("tag"))), levels[-1])
    bottom_row = next((x for x in levels if row_fits(x.get("slice"), x.get("window"))), levels[-1])
    top_fits = row_fits(top_row["title"], top_row.get("tag"))
    texts = {k: v for k, v in top_row.items() if k in ("title", "tag")}
    texts.update({k: v for k, v in bottom_row.items() if k in ("slice", "window")})
    items: list[OverlayText] = []
    top_y, bottom_y = margin, height - margin - box_h
    tag_y = top_y
    if not top_fits and "tag" in texts:
        tag_y = top_y + box_h + 2  # the tag goes under the title rather than on it
    items.append(OverlayText("title", texts["title"], QRectF(left_x, top_y, box_w(texts["title"]), box_h)))
    if "tag" in texts:
        w = box_w(texts["tag"])
        items.append(OverlayText("tag", texts["tag"], QRectF(width - margin - w, tag_y, w, box_h)))
    if "slice" in texts:
        items.append(
            OverlayText("slice", texts["slice"], QRectF(left_x, bottom_y, box_w(texts["slice"]), box_h))
        )
    if "window" in texts:
        w = box_w(texts["window"])
        items.append(OverlayText("window", texts["window"], QRectF(width - margin - w, bottom_y, w, box_h)))

    # orientation letters, inside the part of the image on screen and between the two text rows
    visible = view.image_rect().intersected(QRectF(0, 0, width, height))
    if view.state.shown is not None and not visible.isEmpty():
        band_top = max(item.rect.bottom() for item in items if item.rect.top() < height / 2) + 2
        band_bottom = (
            min(
                (item.rect.top() for item in items if item.rect.top() >= height / 2),
                default=height - margin,
            )
            - 2
        )
        left, right, top, bottom = view.geometry_.labels
        bold_h = fm_bold.height() + 2 * pad_y
        inner_pad = 3.0
        mid_y = min(max(visible.center().y() - bold_h / 2, band_top), band_bottom - bold_h)
        mid_x = visible.center().x()
        places = {
            "orientation-left": (left, visible.left() + inner_pad, mid_y),
            "orientation-right": (right, visible.right() - inner_pad - box_w(right, fm_bold), mid_y),
            "orientation-top": (
                top,
                mid_x - box_w(top, fm_bold) / 2,
                max(visible.top() + inner_pad, band_top),
            ),
            "orientation-bottom": (
                bottom,
                mid_x - box_w(bottom, fm_bold) / 2,
                min(visible.bottom() - inner_pad - bold_h, band_bottom - bold_h),
            ),
        }
        for name, (text, x, y) in places.items():
            w = box_w(text, fm_bold)
            x = min(max(x, left_x), width - margin - w)
            items.append(OverlayText(name, text, QRectF(x, y, w, bold_h), bold=True))
    return items
