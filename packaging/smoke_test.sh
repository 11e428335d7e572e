#!/usr/bin/env bash
# Check a built bundle the way a user would use it, with no project checkout or virtualenv on the path.
set -euo pipefail
BUNDLE="$(cd "${1:-dist/volsynth-studio}" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
env -i HOME="$WORK" PATH=/usr/bin:/bin "$BUNDLE/volsynth" models
# The hardware probe in the frozen build (what decides which settings pay here)
env -i HOME="$WORK" PATH=/usr/bin:/bin "$BUNDLE/volsynth" info | grep -q "kernels  oneDNN"
env -i HOME="$WORK" PATH=/usr/bin:/bin "$BUNDLE/volsynth" generate --steps 5 --out "$WORK/smoke.nii.gz"
test -s "$WORK/smoke.nii.gz" && test -s "$WORK/smoke.json"
# torch.profiler and the comparison path (kernel profile, peak memory, difference volume) in the frozen build.
# B is the streamed decode: fast on every CPU class (bf16 here ran 8 minutes on an AVX2-only CPU).
env -i HOME="$WORK" PATH=/usr/bin:/bin "$BUNDLE/volsynth" compare --b streamed_decode --steps 4 --out "$WORK/compare" 2>/dev/null
test -s "$WORK/compare/difference.nii.gz" && grep -q '"operators"' "$WORK/compare/compare.json"
env -i HOME="$WORK" PATH=/usr/bin:/bin QT_QPA_PLATFORM=xcb xvfb-run -a -s "-screen 0 1600x1000x24" \
  "$BUNDLE/volsynth-studio" --demo "$WORK/demo.png"
test -s "$WORK/demo.png"
mkdir -p "$OLDPWD/build/screenshots" 2>/dev/null && cp "$WORK/demo.png" "$OLDPWD/build/screenshots/bundle-demo.png" || true
echo "smoke test passed: $(du -sh "$BUNDLE" | cut -f1) bundle at $BUNDLE"
