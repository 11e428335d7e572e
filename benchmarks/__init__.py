"""Measurements kept with the repository, not installed with the product: the GPU check kit
(``gpu_suite``, ``gpu_check``, ``gpu_peaks``, ``kernel_categories``; ``packaging/gpu_check.sh`` runs it) and
the research measurements whose figures the docs quote. Run each from the repository root, where the
engine and this folder both import: ``python -m benchmarks.<name> --help``.
"""
