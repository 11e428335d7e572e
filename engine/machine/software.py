"""The software this engine runs on: library versions, for provenance and the tune store's key."""

from __future__ import annotations

import platform
import sys

from engine import __version__


def _monai_version() -> str:
    # Importing MONAI costs about 2 s (its package imports its apps, data and transforms); a process that
    # only needs the version (the tuner's parent, `volsynth info`) reads the installed metadata instead. A
    # frozen build may carry no metadata: then the import it has already paid for, or pays now.
    if "monai" not in sys.modules:
        from importlib import metadata

        try:
            return metadata.version("monai")
        except metadata.PackageNotFoundError:
            pass
    import monai

    return monai.__version__


def library_versions() -> dict[str, str]:
    import numpy
    import torch

    return {
        "volsynth": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "monai": _monai_version(),
        "numpy": numpy.__version__,
    }
