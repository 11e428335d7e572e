"""On a TPU VM the process that starts JAX takes every chip: the Cohort dialog's module finds JAX, checks
plans and device counts, and leaves JAX unimported (for the workers). Exits 0 when so."""

from __future__ import annotations

import sys

import app.cohort.dialog  # noqa: F401 - what opening the dialog imports
from app.cohort.draft import DeviceChoice, local_devices

assert local_devices().jax
choice = DeviceChoice("xla", 8, "dp2xd2/cut@2")
assert choice.plan_problem(None, guidance_scale=3.0) == "", choice.plan_problem(None)
assert DeviceChoice("xla", 6, "dp4").plan_problem(None)
assert choice.describe(None)
assert "jax" not in sys.modules, "JAX was imported"
