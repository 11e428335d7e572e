"""The viewer's fixtures (tests/app/viewer/rig.py): the viewer and its tool bars on ``app_services``."""

from tests.app.viewer.rig import viewer_rig, viewer_rig_3d  # noqa: F401 - fixtures
