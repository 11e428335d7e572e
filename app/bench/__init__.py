"""Benchmarks of the desktop app itself (start-up time, the app's overhead over its engine); each runs the
app in processes of its own (``python -m app.bench.startup``, ``python -m app.bench.app_overhead``)."""
