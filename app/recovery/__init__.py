"""Crash recovery in the window: generated volumes kept on disk until saved or a clean exit, and the bar
that offers a crashed session's back (``app.core.recovery`` is the Qt-free store)."""
