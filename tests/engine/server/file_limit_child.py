"""Run a ``volsynth`` command with this process's open-file limit lowered first (soft and hard: the server
raises its soft limit to the hard one at start).

``python -m tests.engine.server.file_limit_child LIMIT serve --port ...`` is ``volsynth serve`` in a
process that may open at most LIMIT files, for the tests of what a socket flood does at that limit.
"""

import resource
import sys

if __name__ == "__main__":
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))  # before any import opens a file

    from engine.cli import main

    sys.exit(main(sys.argv[2:]))
