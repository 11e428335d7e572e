"""Reference brain anatomy and measurements on it: the MNI152 template on the demo grid (``template``) and the
brain mask and ventricle volume of a T1 image (``measures``), shared by training, evaluation and cohort reports."""
