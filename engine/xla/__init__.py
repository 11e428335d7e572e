"""JAX/XLA: MONAI's networks ported to ``jax.lax`` (the xla backend) and the multi-device planner.

Needs the ``xla`` extra (``jax[tpu]``). Call :func:`engine.xla.runtime.configure_jax` before JAX starts.
"""
