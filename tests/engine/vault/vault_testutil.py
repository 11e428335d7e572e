"""Constants shared by the vault tests (a uniquely named module: safer to import than conftest)."""

from __future__ import annotations

from engine.vault import KdfParams

PASSPHRASE = "correct horse battery staple"
#: Test-only Argon2 parameters (1 MiB, t=1, p=1): every vault in these tests is created with this
#: explicit override except the tests that measure or exercise the real default.
FAST_KDF = KdfParams(memory_kib=1024, iterations=1, lanes=1)
