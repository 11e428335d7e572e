"""Running the official schema-based BIDS validator (bids-validator-deno, the TypeScript validator with
its schema bundled) on a dataset, offline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def validator_binary() -> str:
    """The validator installed with the dev extra (beside this interpreter, or on PATH); skips the test
    with the reason when it is absent."""
    beside = Path(sys.executable).with_name("bids-validator-deno")
    found = str(beside) if beside.is_file() else shutil.which("bids-validator-deno")
    if found is None:
        pytest.skip(
            "bids-validator-deno is not installed (dev extra: pip install bids-validator-deno==3.0.2)"
        )
    return found


def validate(root: Path, scratch: Path) -> dict:
    """The validator's JSON report for ``root``. Deno's caches go to ``scratch``; any attempt to reach the
    network goes to a closed port on 127.0.0.1 (the schema is the one bundled with the validator)."""
    scratch.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "DENO_DIR": str(scratch / "deno"),
        "HOME": str(scratch),
        "DENO_NO_UPDATE_CHECK": "1",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "NO_COLOR": "1",
    }
    run = subprocess.run(
        [validator_binary(), str(root), "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    try:
        report = json.loads(run.stdout)
    except json.JSONDecodeError:
        raise AssertionError(
            f"the validator printed no JSON (rc {run.returncode}): {run.stderr[-2000:]}"
        ) from None
    report["returncode"] = run.returncode
    return report


def issues(report: dict, severity: str) -> list[tuple[str, str | None, str | None]]:
    """(code, sub-code, file) of each issue of ``severity`` ("error" or "warning")."""
    return sorted(
        (i["code"], i.get("subCode"), i.get("location"))
        for i in report["issues"]["issues"]
        if i["severity"] == severity
    )
