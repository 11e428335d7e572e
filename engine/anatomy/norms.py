"""Normative ranges the anatomy checks compare a brain with, each with the published source it comes from.

Every range is stated for a native (unregistered) adult brain, in the terms the tissue maps measure: brain
volume is grey + white matter (parenchyma, no CSF), fractions are of the intracranial volume the maps cover
(GM + WM + CSF) or of the parenchyma. How each published figure was turned into a range is written beside it.

Volumes in a template space (the shipped model's MNI152 2009 grid) are larger than a native brain: the MNI152
template is an average of brains registered to a space bigger than an average head. Absolute volumes in that
space are therefore compared with the native range scaled by the ratio of the template's own brain volume (its
GM + WM maps, the shipped MNI152 2009) to the native population mean (``space_scale``): the template, the mean
brain of that space, then sits at the native mean. Fractions and the asymmetry index need no scaling.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class Source:
    """A published source: who, when, where, which population, and the part of it the numbers come from."""

    key: str
    citation: str
    population: str
    figures: str

    @property
    def short(self) -> str:
        """Author and year, as a line of text cites it: "Matsumae 1996" (the key when it is not of that form)."""
        found = re.fullmatch(r"([a-z]+)(\d{4})", self.key)
        return f"{found[1].capitalize()} {found[2]}" if found else self.key


MATSUMAE_1996 = Source(
    key="matsumae1996",
    citation=(
        "Matsumae M, Kikinis R, Morocz IA, et al. Age-related changes in intracranial compartment volumes in "
        "normal adults assessed by magnetic resonance imaging. J Neurosurg 1996;84(6):982-991 (abstract)"
    ),
    population="49 healthy volunteers aged 24-80 years, MR-based segmentation",
    figures=(
        "brain volume 1302 +/- 112 mL (men), 1143 +/- 105 mL (women); brain 88.6 % and cranial CSF 11.4 % of "
        "the intracranial volume in both sexes"
    ),
)
YAMADA_2023 = Source(
    key="yamada2023",
    citation=(
        "Yamada S, Otani T, Ii S, et al. Aging-related volume changes in the brain and cerebrospinal fluid using "
        "artificial intelligence-automated segmentation. Eur Radiol 2023;33(10):7099-7112 (abstract, introduction)"
    ),
    population="133 healthy Japanese volunteers aged 21-92 years, 3D T1-weighted MRI",
    figures=(
        "intracranial CSF 265 mL (18.7 % of the intracranial volume) in the 20s to 488 mL (33.7 %) above 80 "
        "years; total ventricles about 20 mL (< 2 %) until the 60s, rising after; the authors' earlier 3D T2 "
        "study: ventricles more than 60 mL at 60 years or older"
    ),
)
MILLER_1980 = Source(
    key="miller1980",
    citation=(
        "Miller AKH, Alston RL, Corsellis JAN. Variation with age in the volumes of grey and white matter in the "
        "cerebral hemispheres of man: measurements with an image analyser. Neuropathol Appl Neurobiol "
        "1980;6(2):119-132 (abstract)"
    ),
    population="130 normal cerebral hemispheres (65 men, 65 women), post-mortem, ages 20-100",
    figures="grey-to-white matter volume ratio 1.3 at 20 years, 1.1 at 50, rising to over 1.5 at 100",
)
ASYMMETRY_BOUND = Source(
    key="asymmetry-bound",
    citation="no published whole-hemisphere norm was verified; a plausibility bound of this product",
    population="-",
    figures=(
        "|L - R| / mean(L, R) of GM + WM up to 5 %: regional asymmetries of a few per cent are normal, a whole "
        "hemisphere 5 % larger than the other is not"
    ),
)
SOURCES = {s.key: s for s in (MATSUMAE_1996, YAMADA_2023, MILLER_1980, ASYMMETRY_BOUND)}

#: Native adult population mean brain volume (mL): the mean of Matsumae 1996's men and women.
NATIVE_MEAN_BRAIN_ML = (1302.0 + 1143.0) / 2


@dataclass(frozen=True)
class NormRange:
    """The range a measure is compared with, its unit, source and how the published figures became it."""

    name: str
    label: str
    low: float
    high: float
    unit: str
    source: str
    derivation: str

    def scaled(self, factor: float, why: str) -> NormRange:
        return NormRange(
            self.name,
            self.label,
            self.low * factor,
            self.high * factor,
            self.unit,
            self.source,
            f"{self.derivation}; {why}",
        )


NATIVE_RANGES = (
    NormRange(
        "brain_volume_ml",
        "brain volume (GM+WM)",
        1143.0 - 2.5 * 105.0,
        1302.0 + 2.5 * 112.0,
        "mL",
        MATSUMAE_1996.key,
        "women's mean - 2.5 SD to men's mean + 2.5 SD (Matsumae 1996): 880-1582 mL",
    ),
    NormRange(
        "csf_fraction",
        "CSF fraction of the mapped intracranial volume",
        0.0,
        0.36,
        "",
        f"{MATSUMAE_1996.key}+{YAMADA_2023.key}",
        "upper bound only: the published means run from 11.4 % (Matsumae 1996, adults 24-80) to 33.7 % "
        "(Yamada 2023, above 80), widened by about 2 points; no lower bound, because tissue maps cover a brain "
        "mask, not the whole intracranial space, and miss most subarachnoid CSF outside it (a low fraction "
        "says nothing)",
    ),
    NormRange(
        "gm_share",
        "GM share GM/(GM+WM)",
        round(1.1 / 2.1 * 0.92, 3),  # ratio 1.1 -> share 0.524, less 8 %
        round(min(1.5 / 2.5 * 1.08, 0.99), 3),  # ratio 1.5 -> share 0.60, plus 8 %
        "",
        MILLER_1980.key,
        "grey/white ratio 1.1-1.5 (Miller 1980, ages 20-100) as GM/(GM+WM) 0.524-0.600, widened by 8 % for "
        "MRI probability maps (partial-volume voxels of the cortical ribbon count as GM) against fixed tissue",
    ),
    NormRange(
        "ventricle_volume_ml",
        "ventricle volume",
        3.0,
        60.0,
        "mL",
        YAMADA_2023.key,
        "up to 60 mL, the mean of healthy adults aged 60 or more in Yamada 2023's account of their 3D T2 "
        "study (about 20 mL until the 60s), so larger ventricles of healthy older people may be flagged; the "
        "lower bound (3 mL) is a measurability floor, not a published norm",
    ),
    NormRange(
        "asymmetry_pct",
        "hemispheric asymmetry |L-R|/mean of GM+WM",
        0.0,
        5.0,
        "%",
        ASYMMETRY_BOUND.key,
        ASYMMETRY_BOUND.figures,
    ),
)


@lru_cache(maxsize=1)
def template_brain_ml() -> float:
    """GM + WM volume (mL) of the shipped MNI152 2009 template at 1 mm: the mean brain of that space."""
    from engine.anatomy.template import template_priors_1mm

    priors, mask, affine = template_priors_1mm()
    voxel_ml = abs(float(np.linalg.det(affine[:3, :3]))) / 1000.0
    return float((priors[1][mask].sum() + priors[2][mask].sum()) * voxel_ml)


def space_scale(space: str | None) -> float:
    """How much larger a volume in ``space`` is than a native brain: template brain / native mean for an MNI152
    space, 1 for native (scanner) millimetres."""
    if space and str(space).upper().startswith("MNI152"):
        return template_brain_ml() / NATIVE_MEAN_BRAIN_ML
    return 1.0


def is_template(space: str | None) -> bool:
    """Whether ``space`` is a template space whose volumes are scaled against a native brain (MNI152)."""
    return bool(space) and str(space).upper().startswith("MNI152")


def space_label(space: str | None) -> str:
    """The space a volume's millimetres and millilitres are in, short: "MNI152", or "native" (scanner mm)."""
    return "MNI152" if is_template(space) else "native"


def volume_unit(space: str | None) -> str:
    """The unit of an absolute volume in ``space``: "MNI152 mL" in a template space, "mL" in native mm."""
    return "MNI152 mL" if is_template(space) else "mL"


#: Conditioning inputs that ask for a measure the anatomy check compares (input name -> measure name): the
#: shipped model's, in the mL of its output grid (``ModelSpec.space``).
CONDITION_MEASURES = {"brain_volume": "brain_volume_ml", "ventricle_volume": "ventricle_volume_ml"}


def native_text(value: float, space: str | None) -> str:
    """``value`` mL of ``space`` as a native brain's (``"≈ 956 mL native"``), "" for native mm."""
    scale = space_scale(space)
    return f"\u2248 {value / scale:.0f} mL native" if scale != 1.0 else ""


def condition_against_norm(name: str, value: float, unit: str, space: str | None) -> str:
    """Where a conditioning value (a model's input ``name`` in ``unit`` of ``space``) lies against the adult
    range the anatomy check compares its measure with: "" when within it or when the input asks for no measure
    the check compares; else one line saying which side, in both spaces, and that the check will flag it."""
    measure = CONDITION_MEASURES.get(name)
    if measure is None or unit != "mL" or not np.isfinite(value):
        return ""
    norm, native = ranges_for(space)[measure], ranges_for(None)[measure]
    if norm.low <= value <= norm.high:
        return ""
    side = "below" if value < norm.low else "above"
    # Bounds rounded inwards: a value shown as the bound itself is never said to lie outside it.
    where = f"{math.ceil(norm.low):.0f}-{math.floor(norm.high):.0f} {volume_unit(space)}"
    if space_scale(space) != 1.0:
        where += f", {math.ceil(native.low):.0f}-{math.floor(native.high):.0f} mL native"
    source = SOURCES[norm.source.split("+")[0]].short
    return f"{side} the adult range ({where}, {source}): the anatomy check flags such a brain"


def ranges_for(space: str | None) -> dict[str, NormRange]:
    """The ranges for a volume in ``space`` (None: native): absolute volumes scaled by ``space_scale``."""
    scale = space_scale(space)
    out = {}
    for norm in NATIVE_RANGES:
        if norm.unit == "mL" and scale != 1.0:
            norm = norm.scaled(
                scale,
                f"x {scale:.3f} for {space} (MNI152 2009 template brain {template_brain_ml():.0f} mL / native "
                f"mean {NATIVE_MEAN_BRAIN_ML:.0f} mL)",
            )
        out[norm.name] = norm
    return out
