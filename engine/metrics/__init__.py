"""Measures of how far one result is from another: volume distances (``image``) and the one noise rule for
speed differences (``speed_verdict``), and the one rate/ETA rule of a run in progress (``pace``). Library code
and benchmarks share them."""
