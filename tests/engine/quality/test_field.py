"""The field's measures: FRD as published, the tissue-volume Wasserstein distance, reliability shares, the rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import linalg

from engine.quality import field, radiomics


def test_frd_is_the_published_frechet_distance_in_log():
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((12, 30)), rng.standard_normal((12, 30)) * 1.5 + 0.3
    # FRD's reference code: the squared Fréchet distance through sqrtm of the F x F covariance product.
    s1, s2 = np.cov(x, rowvar=False), np.cov(y, rowvar=False)
    covmean = linalg.sqrtm(s1 @ s2).real
    expected = ((x.mean(0) - y.mean(0)) ** 2).sum() + np.trace(s1) + np.trace(s2) - 2 * np.trace(covmean)
    assert field.frechet_distance(x, y) == pytest.approx(expected, rel=1e-6)
    assert field.log_frd(x, y) == pytest.approx(math.log(expected), rel=1e-6)
    z_ref, z_other = field.standardise(x, y)  # in the reference's units, as FRD normalises
    assert np.allclose(z_ref.mean(0), 0) and np.allclose(z_ref.std(0), 1) and z_other.shape == y.shape


def test_volume_distance_is_how_far_volumes_move():
    rng = np.random.default_rng(4)
    volumes = rng.normal([900, 500, 100], [5, 5, 2], (16, 3))
    shift = np.array([30.0, -40.0, 0.0])
    # A whole cohort moved by one vector: every volume moves its length, the optimal matching keeps the order.
    assert field.volume_distance(volumes, volumes + shift) == pytest.approx(np.linalg.norm(shift))
    assert field.volume_distance(volumes, volumes[::-1]) == pytest.approx(0.0, abs=1e-9)


def test_reliability_drop_is_flagged_with_shares_and_intervals():
    reference = ["within"] * 16
    floor_b = ["within"] * 15 + ["outside"]
    failing = ["within"] * 6 + ["not_brain_like"] * 10
    passes = [np.array([s == field.PASSED for s in x], float) for x in (reference, failing, floor_b)]
    result = field.judge("reliability", field.share_drop, *passes, floor_statistic=field.floor_share_gap)
    assert result["flagged"] and result["n"] == 16
    assert result["value"] == pytest.approx(10 / 16) and result["floor"] == pytest.approx(1 / 16)
    same = field.judge(
        "reliability",
        field.share_drop,
        passes[0],
        passes[0],
        passes[2],
        floor_statistic=field.floor_share_gap,
    )
    assert not same["flagged"]
    share = field.share(failing)
    assert (share["passed"], share["count"]) == (6, 16) and share["by_status"] == {
        "not_brain_like": 10,
        "within": 6,
    }
    low, high = share["interval"]
    assert low < share["share"] < high and not share["reaches_95"]
    low, high = field.share(reference)["interval"]  # all passed: the interval still says how sure 16 make us
    assert low < 1.0 == high


def test_radiomic_features_are_nyxus_ibsi_features_per_volume():
    rng = np.random.default_rng(5)
    shape = (16, 20, 16)
    x, y, z = np.meshgrid(*[np.linspace(-1, 1, s) for s in shape], indexing="ij")
    ball = (x**2 + y**2 + z**2 < 0.6).astype(np.float32)
    smooth = ball + 0.01 * rng.standard_normal(shape).astype(np.float32)
    rough = ball + 0.2 * rng.standard_normal(shape).astype(np.float32)
    matrix, names = radiomics.radiomic_features([smooth, rough, smooth], -0.5, 1.5)
    assert matrix.shape == (3, len(names)) and len(names) > 100
    assert any(n.startswith("3GLCM_") for n in names) and any(n.startswith("3NGTDM_") for n in names)
    assert np.array_equal(matrix[0], matrix[2], equal_nan=True)  # one volume, one row, in order
    spread = names.index("3STANDARD_DEVIATION")
    assert matrix[1, spread] > matrix[0, spread]  # the rough volume varies more inside the brain
