"""Small widgets and the look shared by every part of the app: labels, boxes and a status bar that elide
what does not fit, and the dark theme."""
