"""Runs `volsynth vault ls --vault argv[1] --passphrase-file argv[2]` and, while the vault is unlocked (in its
search), prints RLIMIT_CORE and whether the process is dumpable (prctl PR_GET_DUMPABLE)."""

from __future__ import annotations

import ctypes
import resource
import sys

import engine.vault.store as store
from engine.cli import main

search = store.Vault.search


def spy(self, *args, **kwargs):  # runs while the vault is unlocked
    dumpable = ctypes.CDLL(None).prctl(3, 0, 0, 0, 0)
    print("CORE", resource.getrlimit(resource.RLIMIT_CORE), "DUMPABLE", dumpable, flush=True)
    return search(self, *args, **kwargs)


store.Vault.search = spy  # type: ignore[method-assign]
sys.exit(main(["vault", "ls", "--vault", sys.argv[1], "--passphrase-file", sys.argv[2]]))
