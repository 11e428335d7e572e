"""Training the shipped demo model: synthetic T1 data, autoencoder + latent diffusion training, evaluation.

Nothing here is imported by the sampling path; the app and ``volsynth generate`` only need the model folder
this package writes (``resources/models/brain-t1-demo``).
"""
