"""Viewers: linked slice views (plain Qt), the 3D view (pyvistaqt) and their Qt-free geometry."""
