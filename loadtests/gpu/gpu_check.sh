#!/usr/bin/env bash
# The GPU check in one run: install kvserve and the wheels it lacks into the machine's Python
# without touching torch or triton, then every stage of loadtests/gpu/gpu_check.py (kernel tests
# and parity on CUDA, kernel_bench, the serving benchmark), results as JSON in OUT_DIR.
#
#   here, once:   python loadtests/gpu/gpu_bundle.py download        # cp312 wheels into .whl/ (~18 MiB)
#   there:        bash loadtests/gpu/gpu_check.sh OUT_DIR            # with .whl/ carried beside the tree
#
# Environment: PYTHON (default python3: the interpreter that holds torch), KVSERVE_WHEELS
# (default REPO/.whl), KVSERVE_GPU_WORK (scratch, default /tmp/kvserve-gpu-check; the random
# models go there, not into OUT_DIR). Arguments after OUT_DIR go to gpu_check.py (--only,
# --budget STAGE=S, --pytest-k, --cpu). Without CUDA the same script runs every stage's CPU
# fallback: that is the dry run (python loadtests/gpu/gpu_bundle.py dry-run does it end to end).
set -uo pipefail
OUT=${1:?usage: gpu_check.sh OUT_DIR [gpu_check.py options]}
shift
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-python3}
WHEELS=${KVSERVE_WHEELS:-$REPO/.whl}
WORK=${KVSERVE_GPU_WORK:-/tmp/kvserve-gpu-check}
SITE=$WORK/site
mkdir -p "$OUT" "$WORK"
OUT=$(cd "$OUT" && pwd)
rm -rf "$SITE" "$WORK"/*.log
LOG=$WORK/install.log
start=$(date +%s)

fail() {  # the install failed: say why in OUT_DIR/install.json, as every later stage would
    "$PY" - "$OUT/install.json" "$1" "$LOG" <<'EOF'
import json, sys
out, reason, log = sys.argv[1:]
tail = open(log, errors="replace").read().splitlines()[-40:]
json.dump({"ok": False, "problems": [reason], "log_tail": tail}, open(out, "w"), indent=2)
EOF
    echo "gpu_check: install failed: $1 (see $OUT/install.json)" >&2
    tail -20 "$LOG" >&2
    exit 1
}

echo "gpu_check: $("$PY" --version 2>&1) at $(command -v "$PY"); wheels from $WHEELS" | tee "$LOG"
# The bundle first: exactly the pinned wheels, none of torch/triton/nvidia-*, under 64 MiB.
"$PY" "$REPO/loadtests/gpu/gpu_bundle.py" check --wheels "$WHEELS" --json "$WORK/bundle.json" >>"$LOG" 2>&1 \
    || fail "the wheel bundle does not match loadtests/gpu/gpu_wheels.txt"
# grpcio/protobuf travel too, but are installed only where the machine's own are too old for tritonclient.
mapfile -t SELECTED < <("$PY" "$REPO/loadtests/gpu/gpu_bundle.py" select --wheels "$WHEELS" \
    --json "$WORK/select.json" 2>>"$LOG")
[ "${#SELECTED[@]}" -gt 0 ] || fail "no wheel selected"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "${SELECTED[@]}" \
    >>"$LOG" 2>&1 || fail "pip install of the wheels"
# kvserve itself from this tree, built with the machine's setuptools (no index, no isolation, no deps).
"$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --target "$SITE" \
    "$REPO" >>"$LOG" 2>&1 || fail "pip install of kvserve"
rm -rf "$REPO/build" "$REPO"/*.egg-info  # the in-tree build's leftovers
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
export PATH=$SITE/bin:$PATH
"$PY" - "$WORK/install_step.json" "$WORK/bundle.json" "$WORK/select.json" "$(( $(date +%s) - start ))" <<'EOF'
import json, sys
out, bundle, select, seconds = sys.argv[1:]
json.dump({"install_seconds": int(seconds), "bundle": json.load(open(bundle)), "select": json.load(open(select))},
          open(out, "w"), indent=2)
EOF
echo "gpu_check: installed in $(( $(date +%s) - start ))s into $SITE" | tee -a "$LOG"
cd "$REPO" && "$PY" -m kvserve.loadtests.gpu.gpu_check "$OUT" --repo "$REPO" --work "$WORK" --site "$SITE" \
    --install-json "$WORK/install_step.json" "$@"
