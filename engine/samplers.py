"""The samplers (noise schedulers) the one denoising loop runs, by name.

Names only, with no imports: the CLI offers them as choices without loading numpy or the models, and model
specs, requests and cohort specs check against the same tuple.
"""

SAMPLERS = ("ddpm", "ddim", "pndm", "rflow")
