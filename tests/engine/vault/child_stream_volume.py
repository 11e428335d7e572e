"""Adds or reads a 1 GiB volume through the vault in a fresh process, reporting its peak memory (test_vault_streaming.py)."""

import json
import sys
import time

from engine.vault import Vault


def status(field):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


mode, vault_path, passphrase, arg, dest = sys.argv[1:6]
vault = Vault(vault_path)
vault.unlock(passphrase)
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")  # reset the peak (VmHWM) to the current RSS
before = status("VmRSS")
start = time.perf_counter()
if mode == "import":
    item = vault.import_nifti(arg).id
else:
    item = arg
    vault.export(item, dest, deidentify=(mode == "export-deid"))
seconds = time.perf_counter() - start
print(json.dumps({"item": item, "seconds": seconds, "rss_before": before, "peak": status("VmHWM")}))
