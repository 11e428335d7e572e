"""The recovery tests run beside the Generate side on app services (tests/app/services/generating.py)."""

from tests.app.services.generating import generating  # noqa: F401 - the fixture, for this package's tests
