"""The quality report's PNG: the statistic that decided each verdict, pass and fail told apart, n behind each."""

from __future__ import annotations

import matplotlib
import pytest

from engine.quality import plot
from tests.engine.quality.phantoms import phantom_run

matplotlib.use("Agg")


@pytest.fixture(scope="module")
def run():
    return phantom_run()


@pytest.mark.slow
def test_png_shows_what_decided_each_verdict(run, tmp_path):
    import matplotlib.pyplot as plt

    fig = plot.draw(run.to_dict())
    try:
        titles = [ax.get_title() for ax in fig.axes]
        for name in ("FRD", "tissue-volume distance", "MS-SSIM diversity", "reliability", "permutation rule"):
            assert any(t.startswith(name) for t in titles), name
        assert all("n = 8" in t for t in titles if t.startswith(("FRD", "tissue-volume", "GM")))
        lines = {t.get_text(): t.get_color() for t in fig.texts}
        verdicts = {text.split(":")[0]: (text, colour) for text, colour in lines.items() if ":" in text}
        # fp32 on other seeds passes; each shifted setting fails, in the fail colour, naming what decided
        assert verdicts["PASS  fp32, seeds B"][1] == plot.PASS_COLOUR
        brighter, colour = verdicts["FAIL  brighter"]
        assert colour == plot.FAIL_COLOUR and "FRD" in brighter
        less_gm = " ".join(t for t in lines if "less GM" in t or t.startswith("        "))
        assert "tissue-volume distance" in less_gm and "reliability" in less_gm
        # the reliability panel: passed/checked on each bar (fp32 A, fp32 B, and the settings)
        reliability = next(ax for ax in fig.axes if ax.get_title().startswith("reliability"))
        counts = [t.get_text() for t in reliability.texts if "/" in t.get_text()]
        assert counts == ["8/8", "8/8", "8/8", "4/8"]
    finally:
        plt.close(fig)
    path = tmp_path / "quality.png"
    assert plot.save_png(run, path) and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
