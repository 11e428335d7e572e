"""Generate > Cohort... installed on app services beside the Generate side, as the main window installs it
(tests/app/generating.py): the dialog reads the Generate panel's form and opens a finished volume
into the session."""

from __future__ import annotations

import pytest

from app.cohort import CohortController, install_cohort
from tests.app.generating import generating  # noqa: F401 - the fixture, for this package's tests


@pytest.fixture
def cohort(generating) -> CohortController:  # noqa: F811 - the fixture imported above
    return install_cohort(generating.services)
