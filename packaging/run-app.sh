#!/usr/bin/env bash
# Set up (first run) and start VolSynth Studio on the shipped demo model.
# With no display (a server, CI), it runs under Xvfb, generates one volume with the demo model, saves a
# screenshot to build/screenshots/demo.png and exits, so the main job can be checked headless.
set -euo pipefail
cd "$(dirname "$0")/.."
bash packaging/setup.sh
if [ -n "${DISPLAY:-}" ] || [ -n "${WAYLAND_DISPLAY:-}" ]; then
  exec .venv/bin/volsynth-studio "$@"
fi
echo "run-app: no display found; running under Xvfb in demo mode (screenshot: build/screenshots/demo.png)"
mkdir -p build/screenshots
QT_QPA_PLATFORM=xcb exec xvfb-run -a -s "-screen 0 1600x1000x24" \
  .venv/bin/volsynth-studio --demo build/screenshots/demo.png "$@"
