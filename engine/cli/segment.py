"""``volsynth segment IN --out DIR``: GM, WM and CSF probability maps and a brain mask of any brain MRI volume.

The maps are written as the shipped model writes its own, ``<stem>_label-<name>_probseg.nii.gz`` beside a JSON
sidecar each, with the input's affine and space; the sidecar says how they were made (method, library versions,
contrast) and carries the anatomy check of the maps (``anatomy_check``: ``engine.anatomy.checks``), whose verdict
is also printed. The method is ``engine.anatomy.segment``'s.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_CONTRAST_CHOICES = ("t1w", "t2w", "flair", "swi", "mra")
# The BIDS suffix of the input's name says its contrast when --contrast is not given (sub-01_T2w.nii.gz).
_SUFFIX_CONTRAST = re.compile(r"_(T1w|T2w|FLAIR|swi|angio|MRA)\.nii(\.gz)?$", re.IGNORECASE)


def register(sub) -> None:
    parser = sub.add_parser(
        "segment",
        help="write GM, WM and CSF probability maps and a brain mask of a brain MRI volume",
        description=(
            "Tissue maps of a T1w, T2w or FLAIR brain volume (whole-head or skull-stripped, any grid), "
            "made with MNI152 priors and an EM fit; no model weights are needed."
        ),
    )
    parser.add_argument("input", metavar="IN", help="the volume, .nii or .nii.gz")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder the maps are written to")
    parser.add_argument(
        "--contrast",
        type=str.lower,
        choices=_CONTRAST_CHOICES,
        help="the volume's contrast (default: from the BIDS suffix of its name or its provenance, else t1w); "
        "swi and mra are refused with the reason",
    )
    parser.set_defaults(func=run)


def guess_contrast(path: Path, provenance: dict) -> tuple[str, str]:
    """The contrast of a volume and where that came from: its name's BIDS suffix, its provenance, or t1w."""
    match = _SUFFIX_CONTRAST.search(path.name)
    if match:
        suffix = match.group(1).lower()
        return ("mra" if suffix == "angio" else suffix), "the file name"
    for key in ("modality", "contrast"):
        value = str(provenance.get(key) or "").strip().lower()
        if value:
            return value, "the provenance record"
    return "t1w", "the default (nothing in the name or provenance says)"


def _refuse_non_finite_file(path: Path) -> None:
    """A NaN or infinite voxel in the file is refused: reading a volume replaces them with 0 for display, but maps
    made from a damaged volume would look plausible and be wrong."""
    import nibabel as nib
    import numpy as np

    from engine.errors import InvalidRequest

    image = nib.load(str(path))
    if not isinstance(image, nib.Nifti1Image):  # a NIfTI-2 image is one too
        raise InvalidRequest(f"{path.name} is not a NIfTI volume")
    if not np.issubdtype(image.get_data_dtype(), np.floating):
        slope, inter = image.header.get_slope_inter()
        if all(v is None or np.isfinite(v) for v in (slope, inter)):
            return  # integer voxels with a finite scale cannot be NaN
    data = np.asarray(image.dataobj, dtype=np.float32)
    bad = int(data.size - np.count_nonzero(np.isfinite(data)))
    if bad:
        raise InvalidRequest(
            f"{path.name} has {bad} NaN or infinite voxels; tissue maps need finite intensities"
        )


def run(args) -> int:
    from engine.anatomy.checks import check_maps
    from engine.anatomy.segment import CONTRAST_LABELS, METHOD, TISSUES, check_contrast, segment
    from engine.errors import InvalidRequest, OutputError
    from engine.nifti.io import is_nifti, load_nifti, save_volumes, tissue_path
    from engine.nifti.volume import Volume

    source = Path(args.input).expanduser()
    if not is_nifti(source):
        raise InvalidRequest(f"{source.name} is not a NIfTI file (.nii or .nii.gz); give a brain MRI volume")
    if not source.is_file():
        raise InvalidRequest(f"{source} does not exist or is not a file")
    out = Path(args.out).expanduser()
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} is not a folder; give a folder for the tissue maps")
    volume = load_nifti(source)
    if volume.time_points > 1:
        raise InvalidRequest(
            f"{source.name} is 4D ({volume.time_points} volumes); tissue maps need a 3D volume"
        )
    _refuse_non_finite_file(source)
    if args.contrast:
        contrast, origin = args.contrast, "--contrast"
    else:
        contrast, origin = guess_contrast(source, volume.provenance)
    contrast = check_contrast(contrast)  # SWI, MRA and unknown names end here, with the reason
    print(
        f"segment: {source.name}, {CONTRAST_LABELS[contrast]} (from {origin}), shape {volume.data.shape}",
        file=sys.stderr,
    )

    def on_stage(stage: str, fraction: float) -> None:
        print(f"segment: {stage} ({fraction:.0%})", file=sys.stderr, flush=True)

    result = segment(volume.data, volume.affine, contrast, on_stage=on_stage)
    check = check_maps(result.maps, volume.affine, space=volume.space, maps_from=METHOD)
    out.mkdir(parents=True, exist_ok=True)
    names = (*TISSUES, "brain")
    maps = {name: tissue_path(out / source.name, name) for name in names}
    record = {
        **result.sidecar(),
        "image": source.name,
        "synthetic": volume.synthetic,
        "anatomy_check": check.to_dict(),
    }
    if volume.space:
        record["space"] = volume.space
    # Each map is a volume of its own on the input's grid, with its sidecar; all appear together or none.
    save_volumes(
        [
            Volume(
                result.maps[name],
                volume.affine,
                provenance={**record, "tissue_map": name},
                synthetic=volume.synthetic,
                space=volume.space,
            )
            for name in maps
        ],
        list(maps.values()),
    )
    for path in maps.values():
        print(path)
    means = ", ".join(f"{k} {v:.3g}" for k, v in result.means.items())
    print(f"tissue means: {means}", file=sys.stderr)
    print(f"{source.name}: {check.summary()}", file=sys.stderr)
    return 0
