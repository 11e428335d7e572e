"""VolSynth engine: headless synthesis of 3D MRI volumes with diffusion models.

Never imports Qt, pyvista or VTK (checked by import-linter and tests/engine/test_headless.py).
Heavy modules (torch, monai) load on first use, so ``import engine`` stays cheap.
"""

__version__ = "0.1.0"

from engine.errors import (  # noqa: E402
    BackendUnavailable,
    Cancelled,
    EngineError,
    InvalidRequest,
    ModelInvalid,
    ModelNotFound,
    OutOfMemory,
    OutputError,
    VaultCorrupted,
    VaultError,
    VaultLocked,
)

__all__ = [
    "__version__",
    "BackendUnavailable",
    "Cancelled",
    "EngineError",
    "InvalidRequest",
    "ModelInvalid",
    "ModelNotFound",
    "OutOfMemory",
    "OutputError",
    "VaultCorrupted",
    "VaultError",
    "VaultLocked",
]
