"""Speed and precision settings applied to a model (``apply``), the int8 calibration kept per machine
(``calibration_cache``) and what ``volsynth tune`` measured here (``tune_store``)."""
