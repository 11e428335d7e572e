"""The services' tests that need a run use the Generate side on app services (tests/app/generating.py)."""

from tests.app.generating import generating  # noqa: F401 - the fixture, for this package's tests
