"""Measuring on the user's machine: ``volsynth bench`` (:mod:`engine.measure.bench`) and ``volsynth tune`` /
the app's Measure (:mod:`engine.measure.tune`), on one harness (:mod:`engine.measure.harness`).

Speed is only ever reported as a ratio to fp32 NCDHW measured in the same run on the same noise, with the
numerical difference it cost (PSNR, SSIM, max abs error of the final volume). The GPU check kit and the
one-off research measurements are not part of the product: they live in ``benchmarks/`` at the repository
root.
"""
