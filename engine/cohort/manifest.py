"""The manifest: every item of a cohort and its state, rewritten atomically whenever one changes.

It is what makes resume exact: an item is ``done`` only after its volume and sidecar were renamed into place
(or it was stored in the vault), so a job killed at any moment leaves each item either done (kept) or not
(done again, from the same seed: the same volume).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engine.cohort.dataset import STATE_DIR, write_text_atomic
from engine.errors import InvalidRequest

FORMAT = "volsynth-cohort-manifest/1"
PENDING, DONE, FAILED = "pending", "done", "failed"


def now_utc() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class Manifest:
    def __init__(self, root: Path, data: dict[str, Any]):
        self.root = root
        self.data = data

    @property
    def path(self) -> Path:
        return manifest_path(self.root)

    @classmethod
    def create(cls, root: Path, spec, items, model: dict[str, Any]) -> Manifest:
        data = {
            "format": FORMAT,
            "cohort_id": spec.cohort_id,
            "spec_sha256": spec.sha256,
            "target": spec.target,
            "created_utc": now_utc(),
            "model": model,
            "items": {
                item.participant: {**item.to_dict(), "state": PENDING, "attempts": 0, "errors": []}
                for item in items
            },
            "runs": [],
        }
        manifest = cls(root, data)
        manifest.save()
        return manifest

    @classmethod
    def load(cls, root: Path) -> Manifest:
        path = manifest_path(root)
        if not path.is_file():
            raise InvalidRequest(
                f"{root} is not a cohort folder (no {STATE_DIR / 'manifest.json'}); start one with "
                "`volsynth cohort run SPEC --out DIR`"
            )
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"{path} is damaged ({exc}); it cannot be resumed") from exc
        if data.get("format") != FORMAT:
            raise InvalidRequest(f"{path} is not a VolSynth cohort manifest ({FORMAT})")
        return cls(root, data)

    def save(self) -> None:
        write_text_atomic(self.path, json.dumps(self.data, indent=1, sort_keys=True) + "\n")

    @property
    def items(self) -> dict[str, dict[str, Any]]:
        return self.data["items"]

    def count(self, state: str) -> int:
        return sum(1 for item in self.items.values() if item["state"] == state)

    @property
    def retries(self) -> int:
        """Attempts lost to dead workers (each was retried, or ended the item as failed)."""
        return sum(len(item["errors"]) for item in self.items.values() if item["state"] != FAILED) + sum(
            max(0, len(item["errors"]) - 1) for item in self.items.values() if item["state"] == FAILED
        )

    @property
    def cohort_id(self) -> str:
        return self.data["cohort_id"]


def manifest_path(root: Path) -> Path:
    return Path(root) / STATE_DIR / "manifest.json"
