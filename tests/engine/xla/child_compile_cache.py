"""JAX's compilation cache pointed elsewhere (argv[1]/elsewhere), then the plan cache applied to it: with argv[2]
``on`` (VOLSYNTH_PLAN_CACHE is argv[1]/plans) the compiler's cache becomes the plan cache's ``xla`` folder and a
compile writes nothing elsewhere; with ``off`` (VOLSYNTH_PLAN_CACHE=0) the compiler's cache is off."""

from __future__ import annotations

import sys
from pathlib import Path

import jax

from engine.xla.plan_cache import default_cache, use_for_xla

tmp = Path(sys.argv[1])
jax.config.update("jax_compilation_cache_dir", str(tmp / "elsewhere"))
if sys.argv[2] == "on":
    cache = default_cache()
    assert cache.root == tmp / "plans", cache.root
    assert use_for_xla(cache) == str(tmp / "plans" / "xla")
    assert jax.config.jax_compilation_cache_dir == str(tmp / "plans" / "xla")
    assert jax.config.jax_enable_compilation_cache
    jax.jit(lambda x: x * 3 + 1)(jax.numpy.arange(7.0)).block_until_ready()  # a compile, under the cache
    assert not (tmp / "elsewhere").exists()
else:
    assert use_for_xla(default_cache()) is None and not jax.config.jax_enable_compilation_cache
