"""Loads torchao as the engine does; the torchao logger's level is put back afterwards."""

from __future__ import annotations

import logging

from engine.quantization import torchao_support

torchao_support.torchao()
assert logging.getLogger("torchao").level == logging.NOTSET  # levels put back
print("ok")
