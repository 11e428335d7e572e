"""What VolSynth Studio is for, in the words every place that says it uses (About, first run, User Guide).

The README says it too; keep the four in step. The app shows real patient scans from the vault next to
synthetic volumes, so the statement must be where a clinician sees it, not only in the README.
"""

from __future__ import annotations

INTENDED_USE_HEADLINE = "Intended use: research and education. Not for diagnosis."

INTENDED_USE_TEXT = (
    "VolSynth Studio is for research and education. It is not a medical device: do not use it, or the "
    "volumes it makes, to diagnose, treat or make any clinical decision about a patient. Generated volumes "
    "are synthetic and marked so in their files; real scans kept in the vault are shown for comparison and "
    "teaching."
)

#: QSettings key set once the user has acknowledged the first-run notice.
ACKNOWLEDGED_KEY = "about/intended_use_acknowledged"
