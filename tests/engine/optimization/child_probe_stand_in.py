"""What the machine probe, oneDNN and ATen report in this process (run with the AVX2 stand-in variables set):
one JSON line [oneDNN ISA, native bf16, ATen capability, mkldnn bf16, stand-in variables]."""

from __future__ import annotations

import json

import torch

from engine.machine.probe import probe_machine

probe = probe_machine()
print(
    json.dumps(
        [
            probe.cpu.onednn_isa,
            probe.cpu.native_bf16,
            probe.cpu.torch_capability,
            bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
            sorted(probe.cpu.stand_in),
        ]
    )
)
