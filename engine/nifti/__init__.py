"""Reading and writing NIfTI volumes: the checks every file passes first (``checks``) and the reader and writer
(``io``), with the provenance sidecar."""
