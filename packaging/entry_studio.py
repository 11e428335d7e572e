"""PyInstaller entry point of the desktop app."""

import sys

from app.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
