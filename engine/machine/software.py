"""The software this engine runs on: library versions, for provenance and the tune store's key."""

from __future__ import annotations

import platform

from engine import __version__


def library_versions() -> dict[str, str]:
    import monai
    import numpy
    import torch

    return {
        "volsynth": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "monai": monai.__version__,
        "numpy": numpy.__version__,
    }
