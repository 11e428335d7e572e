#!/usr/bin/env bash
# Check a built bundle the way a user would use it, with no project checkout or virtualenv on the path, and
# check what the user sees: the anatomy check's verdict in the sidecar, tissue maps written, the 3D view drawn.
set -euo pipefail
BUNDLE="$(cd "${1:-dist/volsynth-studio}" && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
# A user's empty environment; HF_ENDPOINT names a port nothing listens on, so Get Models takes its offline path
# whether or not this machine reaches the internet.
run() { env -i HOME="$WORK" PATH=/usr/bin:/bin HF_ENDPOINT=http://127.0.0.1:9 "$@"; }
step() { echo "smoke: $*"; }

step "models"
run "$BUNDLE/volsynth" models
# The hardware probe in the frozen build (what decides which settings pay here)
run "$BUNDLE/volsynth" info | grep -q "kernels  oneDNN"

step "generate, with the shipped model's tissue maps and the anatomy check"
run "$BUNDLE/volsynth" generate --steps 5 --out "$WORK/smoke.nii.gz" 2>&1 | tee "$WORK/generate.log"
test -s "$WORK/smoke.nii.gz" && test -s "$WORK/smoke.json"
for tissue in GM WM CSF ventricles; do test -s "$WORK/smoke_label-${tissue}_probseg.nii.gz"; done
grep -q '"anatomy_check"' "$WORK/smoke.json" && grep -q '"verdict"' "$WORK/smoke.json"
if grep -q "could not be checked" "$WORK/smoke.json" "$WORK/generate.log"; then
  echo "smoke: the anatomy check could not run in the bundle" >&2
  exit 1
fi
grep "anatomy check:" "$WORK/generate.log"

step "segment the generated volume (MNI152 priors from resources/mni152)"
run "$BUNDLE/volsynth" segment "$WORK/smoke.nii.gz" --out "$WORK/seg" 2>&1 | tee "$WORK/segment.log"
for tissue in GM WM CSF brain; do test -s "$WORK/seg/smoke_label-${tissue}_probseg.nii.gz"; done
grep -q "anatomy check:" "$WORK/segment.log"

step "quality report (4 seeds a set, 2 steps, against a 1-step schedule)"
run "$BUNDLE/volsynth" quality --seeds 4 --steps 2 --settings steps:1 --json "$WORK/quality.json" \
  --png "$WORK/quality.png" 2>/dev/null | tail -3
test -s "$WORK/quality.json" && test -s "$WORK/quality.png"

step "Get Models, offline: it names the files to fetch elsewhere and how to add them"
set +e
run "$BUNDLE/volsynth" models get nv-generate-mr-brain --accept-licence >"$WORK/get.log" 2>&1
get_rc=$?
set -e
test "$get_rc" -eq 5 && grep -q "volsynth models add FOLDER --model nv-generate-mr-brain" "$WORK/get.log"

step "vault: create, import the generated volume, list, export"
echo "smoke test passphrase" >"$WORK/passphrase"
VAULT=(--vault "$WORK/vault" --passphrase-file "$WORK/passphrase")
run "$BUNDLE/volsynth" vault init "${VAULT[@]}"
run "$BUNDLE/volsynth" vault import "$WORK/smoke.nii.gz" "${VAULT[@]}"
item="$(run "$BUNDLE/volsynth" vault ls --json "${VAULT[@]}" | grep -o '"id": *"[^"]*"' | head -1 | sed 's/.*"\([^"]*\)"$/\1/')"
test -n "$item"
run "$BUNDLE/volsynth" vault export "$item" "$WORK/exported" "${VAULT[@]}"
ls "$WORK/exported" | grep -q ".nii"

# torch.profiler and the comparison path (kernel profile, peak memory, difference volume) in the frozen build.
# B is the streamed decode: fast on every CPU class (bf16 here ran 8 minutes on an AVX2-only CPU).
step "compare"
run "$BUNDLE/volsynth" compare --b streamed_decode --steps 4 --out "$WORK/compare" 2>/dev/null
test -s "$WORK/compare/difference.nii.gz" && grep -q '"operators"' "$WORK/compare/compare.json"

step "the app: generate under Xvfb, 3D view drawn, anatomy check in the session details, screenshot"
if ! run QT_QPA_PLATFORM=xcb xvfb-run -a -s "-screen 0 1600x1000x24" \
  "$BUNDLE/volsynth-studio" --demo "$WORK/demo.png" >"$WORK/demo.log" 2>&1; then
  tail -40 "$WORK/demo.log" >&2
  exit 1
fi
grep "^demo: [^r]" "$WORK/demo.log"
test -s "$WORK/demo.png"
mkdir -p "$OLDPWD/build/screenshots" 2>/dev/null && cp "$WORK/demo.png" "$OLDPWD/build/screenshots/bundle-demo.png" || true
grep -q "^demo: 3D view: drawn" "$WORK/demo.log" || { echo "smoke: the app's 3D view was not drawn" >&2; exit 1; }
grep "^demo: anatomy check: " "$WORK/demo.log" | grep -qv "could not be checked" \
  || { echo "smoke: no anatomy check in the app's session details" >&2; exit 1; }
echo "smoke test passed: $(du -sh "$BUNDLE" | cut -f1) bundle at $BUNDLE"
