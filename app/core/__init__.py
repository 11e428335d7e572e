"""Qt-free models of the app: session, volumes and coordinate maths, display text, the generation form,
crash recovery, slicing. Widgets are views of these; nothing here imports Qt, pyqtgraph, pyvista or VTK
(an import-linter contract in pyproject.toml keeps it so).
"""
