"""Files and folders: per-user folders (``user_folders``), the files shipped in ``resources/`` (``shipped``) and
durable-write primitives (``durable``)."""
