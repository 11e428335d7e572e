"""Imports a decompression bomb and a good file into a vault, reporting peak memory (test_bomb_memory.py)."""

import json
import resource
import sys
from pathlib import Path

from engine.errors import EngineError
from engine.nifti.io import load_nifti
from engine.vault import KdfParams, Vault

bomb, good, folder = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
vault = Vault.create(
    folder / "vault", "bomb test passphrase", kdf=KdfParams(memory_kib=1024, iterations=1, lanes=1)
)
load_nifti(good)
vault.import_nifti(good)


def peak():
    # VmHWM: this process's own high-water mark. ru_maxrss would also do on its own, but Linux carries the
    # parent's (pytest's) maximum across fork+exec into it, which hides anything below that.
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


baseline = peak()
errors = []
for step in (lambda: load_nifti(bomb), lambda: vault.import_nifti(bomb)):
    try:
        step()
        errors.append(None)
    except EngineError as exc:
        errors.append(str(exc))
print(json.dumps({"baseline": baseline, "peak": peak(), "errors": errors, "items": len(vault.items())}))
