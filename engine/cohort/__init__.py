"""Synthetic cohorts: many volumes from one spec, on Ray, written as a BIDS-derivative dataset.

``volsynth cohort run SPEC --out DIR`` / ``resume DIR`` / ``report DIR``. Ray is imported only when a
cohort runs (it is the optional ``cohort`` extra).
"""

from engine.cohort.dataset import validate_layout, volume_path
from engine.cohort.manifest import Manifest
from engine.cohort.runner import CohortProgress, CohortSummary, cohort_events, resume_cohort, run_cohort
from engine.cohort.spec import CohortItem, CohortSpec, load_spec

__all__ = [
    "CohortItem",
    "CohortProgress",
    "CohortSpec",
    "CohortSummary",
    "Manifest",
    "cohort_events",
    "load_spec",
    "resume_cohort",
    "run_cohort",
    "validate_layout",
    "volume_path",
]
