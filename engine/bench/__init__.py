"""Benchmarks of the optimization settings: ``volsynth bench``, the streamed-decode memory measurement and the GPU check.

Speed is only ever reported as a ratio to fp32 NCDHW measured in the same run on the same noise, with the
numerical difference it cost (PSNR, SSIM, max abs error of the final volume).
"""
