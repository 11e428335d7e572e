"""The catalogue of real models VolSynth can fetch: data in ``resources/catalogue/catalogue.json``.

Each entry says where every file of the model's folder comes from (a hub repository, file and revision as
the owners' own download code names them, or a file shipped with VolSynth), the licence, what the model
makes (modalities, sizes, the contrasts whose quality its owners do not guarantee) and what it needs. The
memory it needs per output size comes from the engine's own estimator (``engine.models.budget``), applied
to the network definitions, so the numbers shown before a download are the ones the loader will check.

``VOLSYNTH_CATALOGUE`` names another catalogue file (a site's own list, or a test's).
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.errors import InvalidRequest, ModelInvalid, ModelNotFound
from engine.files.shipped import resource_path

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class CatalogueFile:
    """One file of a model folder: ``path`` inside the folder, and either a hub source or a shipped copy."""

    path: str
    repo: str | None = None
    filename: str | None = None
    revision: str | None = None
    shipped: Path | None = None
    sha256: str | None = None

    @property
    def from_hub(self) -> bool:
        return self.repo is not None

    @property
    def source_text(self) -> str:
        if self.from_hub:
            return f"{self.repo}/{self.filename} at revision {self.revision}"
        return f"shipped with VolSynth ({self.shipped.name if self.shipped else '?'})"

    @property
    def hub_source(self) -> tuple[str, str]:
        """(repo, filename) of a file fetched from the hub."""
        if self.repo is None or self.filename is None:
            raise ValueError(f"{self.path} is not fetched from the hub")
        return self.repo, self.filename

    @property
    def shipped_copy(self) -> Path:
        """The copy of a file shipped with VolSynth."""
        if self.shipped is None:
            raise ValueError(f"{self.path} is not shipped with VolSynth")
        return self.shipped


@dataclass(frozen=True)
class Licence:
    name: str
    url: str
    summary: str
    applies_to: str = ""
    text: str | None = None


@dataclass(frozen=True)
class CatalogueEntry:
    name: str
    title: str
    version: str
    folder: str
    layout: str
    summary: str
    files: tuple[CatalogueFile, ...]
    licence: Licence
    makes: dict[str, Any]
    networks: dict[str, Any]
    released: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def pinning_note(self) -> str:
        """One sentence when the publisher pins nothing for some hub files (no published SHA-256 and a
        revision that is a name, not a commit), "" when every file is pinned. Said in the catalogue listing
        and the licence prompt: what is fetched then is whatever that name points at today."""
        loose = [
            f for f in self.hub_files if not f.sha256 and not re.fullmatch(r"[0-9a-f]{40}", f.revision or "")
        ]
        if not loose:
            return ""
        revisions = ", ".join(sorted({repr(f.revision) for f in loose}))
        return (
            f"the publisher pins nothing for {len(loose)} of its {len(self.hub_files)} hub files (no published "
            f"SHA-256, revision {revisions} is a name, not a commit): what is fetched is what that name holds "
            "today, checked only against the hub's own SHA-256 and recorded at the first download"
        )

    @property
    def key(self) -> str:
        """What a licence acceptance and a recorded SHA-256 are kept under: the model and its version."""
        return f"{self.name}@{self.version}"

    @property
    def hub_files(self) -> list[CatalogueFile]:
        return [f for f in self.files if f.from_hub]

    def not_guaranteed(self) -> list[str]:
        """'mra (all planes)', 'swi (sagittal and coronal)'...: the contrasts the owners do not guarantee."""
        return [
            f"{m['name']} ({m['not_guaranteed']})"
            for m in self.makes.get("modalities", [])
            if m.get("not_guaranteed")
        ]

    # -- what it needs ---------------------------------------------------------------------------------

    def definitions(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The (U-Net, autoencoder) network definitions, as the loader will build them."""
        nets = self.networks
        if nets.get("builtin") == "brain-ldm":
            from engine.models.reference import BUNDLE_AUTOENCODER, BUNDLE_UNET

            return (
                {**BUNDLE_UNET, "_target_": "monai.networks.nets.DiffusionModelUNet"},
                {**BUNDLE_AUTOENCODER, "_target_": "monai.networks.nets.AutoencoderKL"},
            )
        from engine.models.bundle import _resolve

        config_file = next((f for f in self.files if f.path == nets.get("config")), None)
        if config_file is None or config_file.shipped is None:
            raise ModelInvalid(f"catalogue entry {self.name}: its network config is not shipped")
        config = json.loads(config_file.shipped.read_text(encoding="utf-8"))
        unet = _resolve(config, config[nets["unet"]])
        autoencoder = {**_resolve(config, config[nets["autoencoder"]]), "norm_float16": False}
        return unet, autoencoder

    def weight_bytes_estimate(self) -> int:
        """Bytes of the weights on disk, about: the networks' parameters x 4 (float32 state dicts)."""
        from engine.models.budget import parameter_count

        unet, autoencoder = self.definitions()
        return 4 * (parameter_count(unet, "unet") + parameter_count(autoencoder, "autoencoder"))

    def memory_needs(self) -> list[dict[str, Any]]:
        """For each listed output size: the bytes loading the model and sampling one volume need.

        The engine's estimator (``engine.models.budget``) on the entry's network definitions, with the
        decode counted as the streamed decode's working set where the loader uses it (NV-Generate).
        """
        from engine.models.budget import decoder_activation_bytes, unet_activation_bytes

        unet, autoencoder = self.definitions()
        weights = self.weight_bytes_estimate()
        factor = int(self.networks.get("latent_factor", 4))
        channels = int(self.networks.get("latent_channels", 4))
        out = []
        for size in self.makes.get("sizes", []):
            shape = tuple(int(n) for n in size["size"])
            latent = (channels, *(n // factor for n in shape))
            denoising = unet_activation_bytes(unet, latent)
            decoding = decoder_activation_bytes(autoencoder, (1, *shape))
            if self.networks.get("streamed_decode"):
                from engine.models.budget import STREAMED_DECODE_BUDGET_BYTES

                decoding = min(decoding, STREAMED_DECODE_BUDGET_BYTES + 3 * 4 * math.prod(shape))
            # Loading reads each checkpoint into memory before copying it into the networks: twice the weights.
            total = 2 * weights + denoising + decoding
            out.append(
                {**size, "weights": weights, "denoising": denoising, "decoding": decoding, "total": total}
            )
        return out


def catalogue_path() -> Path:
    override = os.environ.get("VOLSYNTH_CATALOGUE")
    return Path(override) if override else resource_path("catalogue", "catalogue.json")


def _file(raw: dict[str, Any], base: Path, where: str) -> CatalogueFile:
    path = raw.get("path")
    if not isinstance(path, str) or not path or path.startswith("/") or ".." in Path(path).parts:
        raise ModelInvalid(f"{where}: path must be a relative path inside the model folder")
    sha = raw.get("sha256")
    if sha is not None and not (isinstance(sha, str) and _SHA256.match(sha)):
        raise ModelInvalid(f"{where}: sha256 must be 64 lowercase hex digits or null")
    if raw.get("shipped"):
        shipped = (base / raw["shipped"]).resolve()
        if base.resolve() not in shipped.parents:
            raise ModelInvalid(f"{where}: a shipped file must lie beside the catalogue")
        return CatalogueFile(path=path, shipped=shipped, sha256=sha)
    for key in ("repo", "filename", "revision"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ModelInvalid(f"{where}: a hub file needs repo, filename and revision")
    return CatalogueFile(
        path=path, repo=raw["repo"], filename=raw["filename"], revision=raw["revision"], sha256=sha
    )


def load_catalogue(path: str | Path | None = None) -> list[CatalogueEntry]:
    """Every entry of the catalogue file (the shipped one unless ``path`` or ``VOLSYNTH_CATALOGUE``)."""
    path = Path(path) if path else catalogue_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelInvalid(f"cannot read the model catalogue {path}: {exc}") from None
    data = _terminal_safe(data)  # its text reaches terminals and dialogs: no escape or control sequences
    base = path.parent
    entries = []
    for index, raw in enumerate(data.get("models", [])):
        where = f"{path.name} models[{index}]"
        try:
            licence = Licence(**{k: raw["licence"].get(k) for k in ("name", "url", "summary")},
                              applies_to=raw["licence"].get("applies_to", ""),
                              text=raw["licence"].get("text"))  # fmt: skip
            if not _NAME.match(raw["name"]) or not _NAME.match(raw["folder"]):
                raise ModelInvalid(f"{where}: name and folder must be short lowercase names")
            entries.append(
                CatalogueEntry(
                    name=raw["name"],
                    title=raw["title"],
                    version=str(raw["version"]),
                    folder=raw["folder"],
                    layout=raw["layout"],
                    summary=raw.get("summary", ""),
                    files=tuple(_file(f, base, f"{where} {f.get('path')}") for f in raw["files"]),
                    licence=licence,
                    makes=raw.get("makes", {}),
                    networks=raw.get("networks", {}),
                    released=raw.get("released"),
                    raw=raw,
                )
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ModelInvalid(f"{where} is malformed ({type(exc).__name__}: {exc})") from None
    return entries


def _terminal_safe(value: Any, key: str = "") -> Any:
    """Every string in a catalogue's JSON without escape or control sequences (newlines only in a licence's
    ``text``)."""
    from engine.formatting import terminal_safe

    if isinstance(value, str):
        return terminal_safe(value, newlines=key == "text")
    if isinstance(value, dict):
        return {terminal_safe(k, newlines=False): _terminal_safe(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_terminal_safe(v, key) for v in value]
    return value


def find_entry(name: str, path: str | Path | None = None) -> CatalogueEntry:
    entries = load_catalogue(path)
    for entry in entries:
        if name in (entry.name, entry.folder):
            return entry
    known = ", ".join(e.name for e in entries) or "none"
    raise ModelNotFound(f"no model {name!r} in the catalogue; the catalogue has: {known}")


def check_name(name: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise InvalidRequest("give a model name from `volsynth models` (the 'can be fetched' list)")
    return name.strip()
