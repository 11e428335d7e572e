"""The cohort folder as a BIDS-derivative dataset, and a check of its layout against the BIDS rules.

::

    DIR/
      dataset_description.json        DatasetType "derivative", GeneratedBy: tool, version, model sha256
      README                          what this is (synthetic), how it was made
      participants.tsv / .json        one row per finished volume: seed and the conditioning values
      sub-synth0001/anat/sub-synth0001_space-MNI152NLin2009aSym_T1w.nii.gz   (+ .json sidecar: the
                                      provenance record and the BIDS keys, SkullStripped and Description);
                                      _T2w, _FLAIR, _swi, _desc-skullstripped_T2w ... for other modalities
                                      (image_stem); ``space-<label>`` only for models whose volumes lie in a
                                      named template space (their spec's ``space``)
      sub-synth0001/anat/sub-synth0001_space-MNI152NLin2009aSym_label-GM_probseg.nii.gz (+ .json:
                                      Description, SpatialReference) the tissue maps decoded with that
                                      image, one per label channel of the model (GM, WM, CSF, ventricles...)
      code/volsynth/spec.json         the cohort spec as run
      code/volsynth/manifest.json     each item's state: what resume finishes
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine import __version__
from engine.errors import InvalidRequest
from engine.nifti.io import atomic_files, read_provenance, sidecar_path, tissue_path

BIDS_VERSION = "1.10.0"
STATE_DIR = Path("code") / "volsynth"
ROOT_FILES = {"dataset_description.json", "README", "README.md", "CHANGES", "LICENSE"}
ROOT_FILES |= {"participants.tsv", "participants.json"}
_SUBJECT = re.compile(r"^sub-([A-Za-z0-9]+)$")
#: A tissue map beside a subject's image (BIDS derivatives: anatomical segmentations, probabilistic), with the
#: image's space and desc entities in BIDS order (space before label before desc).
_PROBSEG = re.compile(
    r"^(sub-[A-Za-z0-9]+)(?:_space-([A-Za-z0-9]+))?_label-([A-Za-z0-9]+)(?:_desc-[A-Za-z0-9]+)?"
    r"_probseg\.(nii\.gz|json)$"
)
_SKULL_STRIPPED_TEXT = re.compile(r"skull[- ]?stripped", re.IGNORECASE)


#: The BIDS suffix of each modality a model generates (engine.nifti.io.BIDS_IMAGE_SUFFIXES); a skull-stripped
#: modality ("t2w-skullstripped") adds the derivative entity ``desc-skullstripped``.
#: MRA is BIDS's ``angio``.
MODALITY_SUFFIXES = {"t1w": "T1w", "t2w": "T2w", "flair": "FLAIR", "swi": "swi", "mra": "angio"}
SKULL_STRIPPED = "-skullstripped"
#: The maps a segmented cohort's volumes get (``engine.anatomy.segment``): tissue probabilities and the brain mask.
SEGMENTED_MAPS = ("CSF", "GM", "WM", "brain")


def image_stem(participant: str, modality: str | None = None, space: str | None = None) -> str:
    """``sub-X_T1w`` for a T1w volume (and models that name no modality), ``sub-X_T2w``, ``sub-X_FLAIR``,
    ``sub-X_swi``; ``sub-X_desc-skullstripped_T2w`` for a skull-stripped one; with ``space`` (the
    template the volumes lie in) ``sub-X_space-<space>_T1w``, so tools that query by space find them."""
    name = (modality or "t1w").lower()
    base = name.removesuffix(SKULL_STRIPPED)
    if base not in MODALITY_SUFFIXES:
        known = ", ".join(sorted(MODALITY_SUFFIXES))
        raise InvalidRequest(
            f"no BIDS suffix for modality {modality!r}: VolSynth names {known} (+{SKULL_STRIPPED})"
        )
    desc = "_desc-skullstripped" if name != base else ""
    where = f"_space-{space}" if space else ""
    return f"{participant}{where}{desc}_{MODALITY_SUFFIXES[base]}"


def volume_path(root: Path, participant: str, modality: str | None = None, space: str | None = None) -> Path:
    return root / participant / "anat" / f"{image_stem(participant, modality, space)}.nii.gz"


def tissue_paths(
    root: Path, participant: str, names, modality: str | None = None, space: str | None = None
) -> list[Path]:
    """The tissue map files of a participant's volume: ``sub-X[_space-S]_label-<name>_probseg.nii.gz``
    beside it."""
    image = volume_path(root, participant, modality, space)
    return [tissue_path(image, name) for name in names]


def skull_stripped(modality: str | None, description: str | None) -> bool:
    """Whether a model's volumes are skull-stripped (BIDS ``SkullStripped``, REQUIRED for image
    derivatives): a ``-skullstripped`` modality says so, and a model that names no modality says it in its
    spec's description (the shipped demo: "skull-stripped T1-weighted"); otherwise not."""
    if modality:
        return modality.lower().endswith(SKULL_STRIPPED)
    return bool(_SKULL_STRIPPED_TEXT.search(description or ""))


def image_sidecar_keys(model: Mapping[str, Any]) -> dict[str, Any]:
    """The BIDS keys of a cohort image's sidecar (merged into its provenance record), from the manifest's
    model record."""
    modality = model.get("modality") or "t1w"
    where = f" in the template space {model['space']}" if model.get("space") else ""
    return {
        "SkullStripped": bool(model.get("skull_stripped", False)),
        "Description": (
            f"SYNTHETIC {MODALITY_SUFFIXES[modality.lower().removesuffix(SKULL_STRIPPED)]} volume sampled "
            f"from the diffusion model {model.get('id')}{where}; not a patient scan"
        ),
    }


def write_map_sidecars(image: Path, names, model: Mapping[str, Any]) -> None:
    """The JSON sidecar of each tissue map beside ``image`` (written there by save_volume): the map's own
    provenance record (read from its header extension, so readers that take the sidecar first still see
    which map it is) with the BIDS keys Description and SpatialReference (the image whose grid and affine
    the map shares, as a BIDS URI)."""
    root = image.parents[2]
    reference = f"bids::{image.relative_to(root).as_posix()}"
    for name in names:
        map_path = tissue_path(image, name)
        record = read_provenance(map_path)
        record.pop("SkullStripped", None)  # the image's keys, which its record carries, are not the map's
        if record.get("tissue_maps_source") == "method":
            description = (
                f"Probability map of {name} made by segmenting the SYNTHETIC image ({record.get('method')}, "
                f"{record.get('contrast')}) sampled from the diffusion model {model.get('id')}; not a scan's"
            )
        else:
            description = (
                f"SYNTHETIC probability map of {name} decoded from the same latent as the image, "
                f"by the diffusion model {model.get('id')}; not a segmentation of a scan"
            )
        sidecar = {
            **record,
            "Description": description,
            "SpatialReference": reference,
        }
        text = json.dumps(sidecar, indent=2, sort_keys=True, default=str) + "\n"
        write_text_atomic(sidecar_path(map_path), text)


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_files([path]) as (temp,):
        temp.write_text(text, encoding="utf-8")


def write_description(root: Path, cohort_id: str, model: Mapping[str, Any], spec_json: str) -> None:
    """dataset_description.json, README and the spec: written once when the cohort starts.

    ``model`` may name the template ``space`` its volumes lie in and its ``label_channels`` (the tissue
    maps written beside each volume); both are then said in the description and the README.
    """
    shas = model.get("weights_sha256", {})
    space = model.get("space") or None
    labels = list(model.get("label_channels") or ())
    description = {
        "Name": f"VolSynth synthetic cohort {cohort_id}",
        "BIDSVersion": BIDS_VERSION,
        "DatasetType": "derivative",
        "GeneratedBy": [
            {
                "Name": "VolSynth Studio",
                "Version": __version__,
                "Description": (
                    f"SYNTHETIC volumes sampled from the diffusion model {model.get('id')} "
                    f"(weights sha256 {', '.join(f'{k}={v}' for k, v in sorted(shas.items()))}); "
                    "not patient scans."
                ),
                "ModelId": model.get("id"),
                "ModelSHA256": shas,
            }
        ],
        "HowToAcknowledge": "Synthetic data generated with VolSynth Studio; cite the model card of the model.",
        "VolSynthCohortId": cohort_id,
        "Synthetic": True,
    }
    if space:
        description["VolSynthSpace"] = space
    if labels:
        description["VolSynthTissueMaps"] = labels
    if model.get("tissue_maps_method"):
        description["VolSynthTissueMaps"] = list(SEGMENTED_MAPS)
        description["VolSynthTissueMapsMethod"] = model["tissue_maps_method"]
    if model.get("modality"):
        image_stem(
            "sub-x", model["modality"]
        )  # a modality without a BIDS suffix is refused before any volume
        description["VolSynthModality"] = model["modality"]
    write_text_atomic(root / "dataset_description.json", json.dumps(description, indent=2) + "\n")
    where = (
        f"All volumes lie in the template space {space} (the NIfTI sform code says MNI152 where it is one).\n"
        if space
        else ""
    )
    maps = (
        f"Each volume comes with paired tissue maps decoded from the same latent, {', '.join(labels)}: "
        "probabilities in [0, 1] on the volume's grid, beside it as "
        f"sub-<label>{f'_space-{space}' if space else ''}_label-<name>_probseg.nii.gz "
        "(also SYNTHETIC, not segmentations of a scan).\n"
        if labels
        else ""
    )
    if model.get("tissue_maps_method"):
        maps = (
            f"Each volume is segmented into tissue maps, {', '.join(SEGMENTED_MAPS)}, by "
            f"{model['tissue_maps_method']} (probabilities in [0, 1] on the volume's grid, beside it as "
            f"sub-<label>{f'_space-{space}' if space else ''}_label-<name>_probseg.nii.gz; each map's sidecar "
            "says how it was made). A volume the method refuses (not brain-like) has none; its sidecar's "
            "tissue_maps_not_made says why.\n"
        )
    readme = (
        f"# Synthetic cohort {cohort_id}\n\n"
        "Every volume in this dataset is SYNTHETIC: sampled by VolSynth Studio from the diffusion model "
        f"{model.get('id')}; none is a patient scan. Each volume's JSON sidecar records how it was made "
        "(model and weights sha256, sampler, steps, seed, conditioning, settings, device, versions).\n"
        f"{maps}{where}"
        "participants.tsv lists the seed and the requested conditioning values of each volume.\n"
        "code/volsynth/ holds the cohort spec and the manifest `volsynth cohort resume` works from.\n"
    )
    write_text_atomic(root / "README", readme)
    write_text_atomic(root / STATE_DIR / "spec.json", spec_json + "\n")


def write_participants(root: Path, rows: list[dict[str, Any]], units: Mapping[str, str]) -> None:
    """participants.tsv (+ .json describing its columns) from the finished items, in participant order."""
    conditions = sorted({name for row in rows for name in row["conditioning"]})
    buffer = io.StringIO()
    writer = csv.writer(buffer, delimiter="\t", lineterminator="\n")
    writer.writerow(["participant_id", "seed", *conditions, "synthetic"])
    for row in sorted(rows, key=lambda r: r["participant"]):
        values = [_tsv(row["conditioning"].get(name)) for name in conditions]
        writer.writerow([row["participant"], row["seed"], *values, "true"])
    write_text_atomic(root / "participants.tsv", buffer.getvalue())
    columns: dict[str, Any] = {
        # The file's own description (BIDS recommends one for every file of a derivative dataset).
        "Description": "One row per synthetic subject: the seed and requested conditioning of its volume",
        "participant_id": {"Description": "Synthetic subject: one generated volume"},
        "seed": {"Description": "Seed of the initial noise; the same seed and settings give the same volume"},
        "synthetic": {"Description": "Always true: generated by a model, not scanned"},
    }
    for name in conditions:
        columns[name] = {"Description": f"Requested conditioning value {name}", "Units": units.get(name, "")}
    write_text_atomic(root / "participants.json", json.dumps(columns, indent=2) + "\n")


def _tsv(value: Any) -> str:
    return "n/a" if value is None else f"{value:.12g}"


def read_participants(root: Path) -> list[dict[str, str]]:
    path = root / "participants.tsv"
    if not path.is_file():
        return []
    with open(path, encoding="utf-8", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t"))


# Long on purpose: one checklist of the dataset's BIDS rules, in the order of the docstring.
def validate_layout(root: str | Path) -> list[str]:
    """Problems with ``root`` as a BIDS-derivative dataset of synthetic volumes ([] when it is valid).

    The image suffix follows the modality dataset_description.json names (``VolSynthModality``; T1w
    without one).

    Checks the rules this dataset relies on (BIDS 1.10: dataset_description fields for derivatives,
    entity and file naming, sidecars, participants.tsv against the subject folders, n/a for missing
    values), that every volume and tissue map is marked SYNTHETIC, and that each volume has every tissue
    map the description names (``VolSynthTissueMaps``); with the ``bids-validator`` package installed,
    every file path is also checked against its rules (and tissue maps against the BIDS schema's rules
    for derivatives, with ``bidsschematools``).
    """
    root = Path(root)
    problems: list[str] = []
    desc_path = root / "dataset_description.json"
    if not desc_path.is_file():
        return [f"{root}: no dataset_description.json"]
    try:
        desc = json.loads(desc_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        return [f"dataset_description.json is not valid JSON: {exc}"]
    for key in ("Name", "BIDSVersion", "DatasetType", "GeneratedBy"):
        if key not in desc:
            problems.append(f"dataset_description.json lacks {key}")
    if desc.get("DatasetType") != "derivative":
        problems.append("dataset_description.json: DatasetType must be 'derivative'")
    generated = desc.get("GeneratedBy")
    if not isinstance(generated, list) or not generated or not all("Name" in g for g in generated):
        problems.append("dataset_description.json: GeneratedBy must be a list of objects with Name")
    elif not generated[0].get("Version") or not generated[0].get("ModelSHA256"):
        problems.append("dataset_description.json: GeneratedBy lacks the tool version or model sha256")
    labels = desc.get("VolSynthTissueMaps") or []
    if not isinstance(labels, list) or not all(isinstance(n, str) and n.isalnum() for n in labels):
        problems.append(
            "dataset_description.json: VolSynthTissueMaps must be a list of names (letters, digits)"
        )
        labels = []
    modality = desc.get("VolSynthModality") or None
    space = desc.get("VolSynthSpace") or None
    if space is not None and not (isinstance(space, str) and space.isalnum()):
        problems.append("dataset_description.json: VolSynthSpace must be a template name (letters, digits)")
        space = None
    try:
        image_stem("sub-x", modality)
    except InvalidRequest as exc:
        problems.append(f"dataset_description.json: VolSynthModality: {exc}")
        modality = None
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir() and (entry.name == "code" or _SUBJECT.match(entry.name)):
            continue
        if entry.is_file() and entry.name in ROOT_FILES:
            continue
        problems.append(f"{entry.name}: not allowed at the top of a BIDS dataset")
    subjects = set()
    for sub in sorted(p for p in root.glob("sub-*") if p.is_dir()):
        label = _SUBJECT.match(sub.name)
        if not label:
            problems.append(f"{sub.name}: subject labels are letters and digits only")
            continue
        subjects.add(sub.name)
        for entry in sorted(sub.rglob("*")):
            rel = entry.relative_to(root).as_posix()
            if entry.is_dir():
                if entry != sub / "anat":
                    problems.append(f"{rel}: unexpected folder (volumes live in sub-*/anat/)")
                continue
            if entry.name.startswith("."):
                problems.append(f"{rel}: a leftover temporary file")
                continue
            probseg = _PROBSEG.match(entry.name)
            if entry.parent == sub / "anat" and probseg and probseg.group(1) == sub.name:
                if probseg.group(2) != space:
                    problems.append(f"{rel}: the space entity does not say {space or 'no space'}")
                if entry.name.endswith(".nii.gz"):
                    if probseg.group(3) not in labels:
                        problems.append(f"{rel}: a tissue map dataset_description.json does not name")
                    problems += _check_synthetic(entry)
                continue
            stem = image_stem(sub.name, modality, space)
            if entry.parent != sub / "anat" or entry.name not in (f"{stem}.nii.gz", f"{stem}.json"):
                problems.append(
                    f"{rel}: name does not follow {image_stem('sub-<label>', modality, space)}.nii.gz / "
                    f".json or {tissue_path(Path(image_stem('sub-<label>', modality, space) + '.nii.gz'), '<name>').name}"
                )
        nifti = volume_path(root, sub.name, modality, space)
        if not nifti.is_file():
            problems.append(f"{sub.name}: no {nifti.name}")
            continue
        if not nifti.with_name(f"{image_stem(sub.name, modality, space)}.json").is_file():
            problems.append(f"{sub.name}: no JSON sidecar for {nifti.name}")
        problems += _check_synthetic(nifti)
        if desc.get("VolSynthTissueMapsMethod") and _maps_not_made(nifti, modality, space, sub.name):
            continue  # segmentation refused this volume and its sidecar says why: no maps is its state
        for path in tissue_paths(root, sub.name, labels, modality, space):
            if not path.is_file():
                problems.append(f"{sub.name}: no tissue map {path.name}")
    rows = read_participants(root)
    if not (root / "participants.tsv").is_file():
        problems.append("no participants.tsv")
    else:
        header = (root / "participants.tsv").read_text(encoding="utf-8").split("\n", 1)[0].split("\t")
        if header[:1] != ["participant_id"]:
            problems.append("participants.tsv: the first column must be participant_id")
        listed = [r.get("participant_id", "") for r in rows]
        if len(set(listed)) != len(listed):
            problems.append("participants.tsv lists a participant twice")
        for missing in sorted(subjects - set(listed)):
            problems.append(f"participants.tsv lacks {missing}")
        for extra in sorted(set(listed) - subjects):
            problems.append(f"participants.tsv lists {extra}, which has no folder")
        for row in rows:
            for key, value in row.items():
                if value is None or value == "":
                    problems.append(
                        f"participants.tsv: empty {key} for {row.get('participant_id')} (use n/a)"
                    )
    problems += _bids_validator_problems(root)
    return problems


def _maps_not_made(nifti: Path, modality, space, participant: str) -> bool:
    side = nifti.with_name(f"{image_stem(participant, modality, space)}.json")
    try:
        return bool(json.loads(side.read_text(encoding="utf-8")).get("tissue_maps_not_made"))
    except (OSError, ValueError, AttributeError):
        return False


def _check_synthetic(nifti: Path) -> list[str]:
    import nibabel as nib

    try:
        header = nib.load(str(nifti)).header
    except Exception as exc:  # a damaged file is a finding, not a crash of the check
        return [f"{nifti.name}: not readable ({exc})"]
    if not isinstance(header, nib.Nifti1Header):  # a NIfTI-2 header is one too
        return [f"{nifti.name}: not a NIfTI file"]
    descrip = header["descrip"].item().decode("ascii", "replace")
    if "SYNTHETIC" not in descrip.upper():
        return [f"{nifti.name}: not marked SYNTHETIC in its header"]
    return []


def _bids_validator_problems(root: Path) -> list[str]:
    try:
        from bids_validator import BIDSValidator
    except ImportError:
        return []
    validator = BIDSValidator()
    derivative = None  # the BIDS schema's rules for derivative files, loaded when first needed
    problems = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_dir() or rel.parts[0] in ("code",) or any(p.startswith(".") for p in rel.parts):
            continue
        if rel.name in ("README", "README.md", "CHANGES", "LICENSE"):
            continue
        if validator.is_bids("/" + rel.as_posix()):
            continue
        # bids-validator knows raw datasets only; a tissue map is a derivative (BIDS: "Segmentations"), and
        # so is an image with a space entity (BIDS: "Preprocessed or cleaned data").
        if _PROBSEG.match(rel.name) or "_space-" in rel.name:
            if derivative is None:
                derivative = _derivative_rules()
            if derivative is False or any(rule.match(rel.as_posix()) for rule in derivative):
                continue
        problems.append(f"{rel.as_posix()}: bids-validator does not accept this path")
    return problems


def _derivative_rules():
    """Compiled file-name rules for BIDS derivatives from ``bidsschematools`` (installed with pybids), or
    False without it (the name was then checked against the probseg pattern only)."""
    try:
        from bidsschematools.rules import regexify_filename_rules
        from bidsschematools.schema import load_schema

        schema = load_schema()
        rules = regexify_filename_rules(schema.rules.files.deriv, schema, level=2)
        return [re.compile(rule["regex"]) for rule in rules]
    except Exception:  # noqa: BLE001 - not installed, or a version with another API: fall back
        return False
