"""VolSynth engine: headless synthesis of 3D MRI volumes with diffusion models.

Never imports Qt, pyvista or VTK (checked by import-linter and tests/engine/test_headless.py).
Heavy modules (torch, monai) load on first use, so ``import engine`` stays cheap.
"""

__version__ = "0.1.0"

# torch.profiler's back end (kineto) writes "USDT: ... profiler_start", "STAGE: ..." and, when a worker thread
# profiles, "ERROR: External init callback ..." straight to file descriptor 2. It reads its log level when
# torch loads, so the level is set here, before anything in the engine imports torch (engine/telemetry/kernel_profile.py).
from engine.telemetry.kernel_profile import quiet_kineto  # noqa: E402

quiet_kineto()

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
