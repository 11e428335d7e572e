"""Checks of what callers hand the vault to store: JSON metadata, the dates people type, tissue maps and
the template space a provenance names."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import numpy as np

from engine.errors import InvalidRequest


def json_copy(value, what: str):
    """Deep copy through JSON, refusing what would not survive the round trip unchanged."""
    try:
        text = json.dumps(value, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"{what} must be JSON data (strings, numbers, lists, dicts): {exc}") from exc
    out = json.loads(text)
    if out != value:
        raise InvalidRequest(f"{what} must be JSON data; tuples or non-string keys change in storage")
    return out


def json_dict(value, what: str) -> dict:
    """A metadata dict (None: empty) deep-copied through JSON; InvalidRequest for anything else."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"{what} must be a dict, got {type(value).__name__}")
    return json_copy(value, what)


_DATE_FIELDS = (("patient", "birth_date", "birth date"), ("study", "date", "study date"))


def normalize_date(value, what: str) -> str:
    """A calendar date typed by a person (``YYYY-MM-DD`` or DICOM's ``YYYYMMDD``) as ``YYYYMMDD``.

    Raises:
        InvalidRequest: Not a real date, before 1850 or in the future, naming the field and the form to use.
    """
    text = str(value).strip()
    digits = text.replace("-", "") if len(text) == 10 and text[4] == "-" and text[7] == "-" else text
    try:
        if len(digits) != 8 or not digits.isdigit():
            raise ValueError("wrong form")
        day = datetime.strptime(digits, "%Y%m%d").date()
    except ValueError:
        raise InvalidRequest(
            f"{what} {text!r} is not a valid date; use YYYY-MM-DD (for example 2024-01-31)"
        ) from None
    today = datetime.now(UTC).date()
    if day.year < 1850 or (day - today).days > 1:
        raise InvalidRequest(f"{what} {text!r} is out of range: it must lie between 1850 and today")
    return digits


def check_dates(record: dict) -> None:
    """Validate and normalise the dates people type (patient birth date, study date) in place."""
    for section, key, what in _DATE_FIELDS:
        values = record.get(section) or {}
        if values.get(key) not in (None, ""):
            values[key] = normalize_date(values[key], what)


#: A tissue map's name: what a BIDS ``label-<name>`` entity allows (letters and digits), as model specs do.
MAX_TISSUE_NAME = 40


def check_tissue_name(name) -> str:
    """``name`` if it is a valid tissue map name, else InvalidRequest saying what one is."""
    if not isinstance(name, str) or not name.isascii() or not name.isalnum() or len(name) > MAX_TISSUE_NAME:
        raise InvalidRequest(
            f"a tissue map name must be 1-{MAX_TISSUE_NAME} letters and digits (e.g. GM), "
            f"got {str(name)[:60]!r}"
        )
    return name


def check_tissue(tissue, shape: tuple[int, ...]) -> list[tuple[str, np.ndarray]]:
    """The tissue maps to store with a volume of ``shape``: (name, 3D real array on the volume's grid)."""
    if not tissue:
        return []
    if not hasattr(tissue, "items"):
        raise InvalidRequest(f"tissue maps must be a mapping of name -> array, got {type(tissue).__name__}")
    out = []
    for name, value in tissue.items():
        check_tissue_name(name)
        arr = np.asarray(value)
        if not np.issubdtype(arr.dtype, np.number) or np.iscomplexobj(arr) or arr.shape != tuple(shape[:3]):
            raise InvalidRequest(
                f"tissue map {name} must be a real-valued array of the volume's grid {tuple(shape[:3])}, "
                f"got {arr.dtype} {arr.shape}"
            )
        out.append((name, arr))
    return out


def template_space(provenance: dict | None) -> str | None:
    """The template space a provenance record names (``"space"``, e.g. ``MNI152NLin2009aSym``), if any."""
    space = (provenance or {}).get("space")
    return space if isinstance(space, str) and space else None
