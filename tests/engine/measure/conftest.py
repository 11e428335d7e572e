"""bench and tune prepare settings as the optimization tests do: calibration measured afresh, never cached."""

from tests.engine.optimization.conftest import no_calibration_cache  # noqa: F401 - the autouse fixture, here too
