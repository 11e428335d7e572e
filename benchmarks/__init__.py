"""Measurements kept with the repository, not installed with the product: the GPU check kit
(``gpu_suite``, ``gpu_check``, ``gpu_peaks``, ``kernel_categories``; ``packaging/gpu_check.sh`` runs it) and
the research measurements whose figures the docs quote, the app's start-up and overhead among them. Run each
from the repository root, where the engine, the app and this folder import: ``python -m benchmarks.<name>``.
"""
