"""int8 on the AVX2 stand-in: the reduce_range choice and its PSNR (test_quantization_stack.py)."""

import copy

import torch
from torch import nn

from engine.metrics.image import psnr
from engine.quantization import Calibration, candidate_layers, quantize_int8

torch.manual_seed(0)
model = nn.Sequential(nn.Conv3d(64, 64, 3, padding=1)).eval()
x = torch.rand(1, 64, 10, 10, 10) * 4 - 0.2  # large post-activation values: u8 x s8 pair sums overflow int16
calibration = Calibration()
handles = calibration.attach(model, candidate_layers(model))
with torch.inference_mode():
    reference = model(x)
for h in handles:
    h.remove()
for reduce_range in (False, None):
    q = copy.deepcopy(model)
    quantize_int8(q, calibration, ["0"], reduce_range=reduce_range)
    with torch.inference_mode():
        print(f"{reduce_range} {q[0].reduce_range} {psnr(reference, q(x)):.1f}")
