"""VolSynth engine: headless synthesis of 3D MRI volumes with diffusion models.

Never imports Qt, pyvista or VTK (checked by import-linter and tests/engine/cli/test_headless.py).
Heavy modules (torch, monai) load on first use, so ``import engine`` stays cheap.
"""

__version__ = "0.1.0"

import os

# torch.profiler's back end (kineto) writes "USDT: ... profiler_start", "STAGE: ..." and, when a worker thread
# profiles, "ERROR: External init callback ..." straight to file descriptor 2. It reads its log level when
# torch loads, so the level is set here, before anything in the engine imports torch; 6 is above kineto's
# highest level (USDT = 5). engine/telemetry/kernel_profile.py sets it again before each profile. The root
# package imports nothing above engine.errors, so every layer may import it (for ``__version__``).
KINETO_QUIET_LEVEL = "6"
os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET_LEVEL)

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
