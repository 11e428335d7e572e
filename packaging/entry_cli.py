"""PyInstaller entry point of the `volsynth` command line."""

import multiprocessing
import sys

from engine.cli import main

if __name__ == "__main__":
    multiprocessing.freeze_support()
    sys.exit(main())
