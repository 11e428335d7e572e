"""Dockable panels added to the main window with ``MainWindow.add_dock`` (metrics, and more to come)."""
