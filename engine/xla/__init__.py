"""JAX/XLA: MONAI's networks ported to ``jax.lax`` (the xla backend) and the multi-device planner.

Needs the ``xla`` extra (``jax[tpu]``). Call :func:`engine.xla.runtime.configure_jax` before JAX starts.
"""

PRECISIONS = ("highest", "high", "default")  # XLA's matmul precision names (jax.lax.Precision)
PRECISION_MEANING = {
    "highest": "float32 (full-precision matmuls and convolutions)",
    "high": "bf16x3 passes (about float32 on TPUs)",
    "default": "one bf16 pass per float32 matmul on TPUs (float32 on CPUs)",
}
