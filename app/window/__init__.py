"""The main window: its construction, menus, tool bars, status bar, file commands and remembered settings."""
