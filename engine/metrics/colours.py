"""The colours every verdict is drawn in: pass and fail, told apart by readers with any colour vision.

Okabe and Ito's palette (2008): blue against vermillion or orange stays distinct under protanopia, deuteranopia
and tritanopia, where the green and red the reports used before merge. Drawings pair them with a word (PASS,
FAIL, FLAGGED) and, where they plot points, with a marker shape, so that a greyscale print still says which.
"""

from __future__ import annotations

PASS_COLOUR, FAIL_COLOUR = "#0072B2", "#D55E00"  # on white: blue, vermillion
PASS_ON_DARK, FAIL_ON_DARK = "#56B4E9", "#E69F00"  # on a dark background: sky blue, orange
