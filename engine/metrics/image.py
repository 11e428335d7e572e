"""How far an optimized result is from the fp32 reference: PSNR, SSIM, max abs error."""

from __future__ import annotations

import math

import numpy as np


def psnr(reference, test) -> float:
    """PSNR in dB with the reference's own value range as the peak (inf when identical).

    The one PSNR of the project (benchmarks, comparisons, the mixed-precision search, the GPU check):
    scikit-image's, on float64 copies; torch tensors are accepted and moved to the CPU.
    """
    from skimage.metrics import peak_signal_noise_ratio

    ref = _as_float64(reference)
    tst = _as_float64(test)
    if np.array_equal(ref, tst):
        return math.inf  # scikit-image would divide by a zero MSE
    data_range = float(ref.max() - ref.min()) or 1.0
    return float(peak_signal_noise_ratio(ref, tst, data_range=data_range))


def _as_float64(array) -> np.ndarray:
    if hasattr(array, "detach"):  # a torch tensor
        array = array.detach().cpu().double().numpy()
    return np.asarray(array, dtype=np.float64)


def ssim(reference: np.ndarray, test: np.ndarray) -> float | None:
    """Mean SSIM over batch items and channels of (B, C, X, Y, Z) arrays; None if scikit-image is missing."""
    try:
        from skimage.metrics import structural_similarity
    except ImportError:
        return None
    ref = np.asarray(reference, dtype=np.float64)
    tst = np.asarray(test, dtype=np.float64)
    ref = ref.reshape(-1, *ref.shape[-3:])
    tst = tst.reshape(-1, *tst.shape[-3:])
    data_range = float(ref.max() - ref.min()) or 1.0
    win = min(7, *(s if s % 2 else s - 1 for s in ref.shape[-3:]))
    if win < 3:
        return None
    return float(
        np.mean(
            [
                structural_similarity(r, t, data_range=data_range, win_size=win)
                for r, t in zip(ref, tst, strict=True)
            ]
        )
    )


def compare(reference: np.ndarray, test: np.ndarray) -> dict[str, float | None]:
    """PSNR, SSIM and max abs error of ``test`` against ``reference``."""
    diff = np.abs(np.asarray(test, dtype=np.float64) - np.asarray(reference, dtype=np.float64))
    return {"psnr_db": psnr(reference, test), "ssim": ssim(reference, test), "max_abs_err": float(diff.max())}
