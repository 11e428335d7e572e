"""Catalogue entries served by the loopback hub: the real catalogue's sources, with small seeded weights.

The test catalogue is the shipped ``resources/catalogue/catalogue.json`` with one change: NV-Generate's
shipped configs are the tiny network's (so the tiny weights fit them). Every hub file keeps the repository,
file name and revision the real catalogue names, so a get of each entry exercises the real sources.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
from pathlib import Path

from engine.files.shipped import resource_path
from engine.testing import write_maisi_folder
from tests.engine.models.bundles import write_bundle
from tests.engine.models.hub_server import HubState

MAISI_DIM = (32, 32, 32)
MAISI_SPACING = (7.52, 7.52, 5.44)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_hub_content(root: Path) -> dict:
    """Write the fixture model files under ``root`` once: {entry name: folder with the files}."""
    maisi = write_maisi_folder(root / "maisi", dim=MAISI_DIM, spacing=MAISI_SPACING, docs=False, seed=3)
    bundle = write_bundle(root / "bundle", seed=4)
    return {"nv-generate-mr-brain": maisi, "brain-ldm": bundle}


def write_test_catalogue(folder: Path, content: dict, edit=None) -> Path:
    """The shipped catalogue, NV-Generate's configs swapped for the tiny ones; ``edit(data)`` may change it."""
    shipped = resource_path("catalogue", "catalogue.json")
    data = json.loads(shipped.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    maisi = content["nv-generate-mr-brain"]
    for entry in data["models"]:
        for file in entry["files"]:
            if not file.get("shipped"):
                continue
            destination = folder / file["shipped"]
            destination.parent.mkdir(parents=True, exist_ok=True)
            tiny = maisi / file["path"]
            shutil.copyfile(tiny if tiny.is_file() else shipped.parent / file["shipped"], destination)
            file["sha256"] = _sha(destination)
    if edit is not None:
        edit(data)
    path = folder / "catalogue.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def serve_entries(state: HubState, content: dict, catalogue: Path) -> dict[str, int]:
    """Put every hub file of every catalogue entry on the hub; returns {entry: bytes of its hub files}."""
    data = json.loads(catalogue.read_text())
    sizes = {}
    for entry in data["models"]:
        total = 0
        for file in entry["files"]:
            if file.get("repo"):
                local = content[entry["name"]] / file["path"]
                state.add(file["repo"], file["revision"], file["filename"], local.read_bytes())
                total += local.stat().st_size
        sizes[entry["name"]] = total
    return sizes


def copy_on_a_stick(folder: Path, content: dict, change=None) -> Path:
    """NV-Generate's two hub files in ``folder`` (a "USB stick"), under models/; ``change(name, checkpoint)`` may
    edit a checkpoint before it is written."""
    import torch

    (folder / "models").mkdir(parents=True)
    for name in ("diff_unet_3d_rflow-mr-brain_v1.pt", "autoencoder_v1.pt"):
        source = content["nv-generate-mr-brain"] / "models" / name
        if change is None:
            shutil.copyfile(source, folder / "models" / name)
            continue
        checkpoint = torch.load(source, weights_only=True)
        change(name, checkpoint)
        torch.save(checkpoint, folder / "models" / name)
    return folder


def widen_one_tensor(name: str, checkpoint: dict) -> None:
    """A ``copy_on_a_stick`` change: one 3D convolution of the autoencoder gets an output channel more (a file
    of about the right size whose network is of another design)."""
    import torch

    if name.startswith("autoencoder"):
        state = checkpoint.get("state_dict", checkpoint)
        key = next(k for k, v in state.items() if getattr(v, "ndim", 0) == 5)
        shape = list(state[key].shape)
        shape[0] += 1
        state[key] = torch.zeros(shape)


def with_sha(data: dict, name: str, path: str, sha: str) -> dict:
    data = copy.deepcopy(data)
    for entry in data["models"]:
        if entry["name"] == name:
            for file in entry["files"]:
                if file["path"] == path:
                    file["sha256"] = sha
    return data
