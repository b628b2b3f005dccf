#!/bin/bash
# The device-machine study of docs/benchmarks.md ("auto on 16 quiet cores"), in one call, run
# from an unpacked archive of the checkout:
#   KIT: a folder holding part.0 part.1 (the bundled GGUF in pieces, carried over earlier calls),
#        model.sha256 (its sha256) and w/ (the wheels the machine lacks: aiortc, av, gguf, pydantic, ...)
#   OUT: where the profile, predictions, record and log go; ROOMS_S: start no room after this many
#   seconds of the room phase.  ROWS (environment): the rows, ';'-separated (spec_auto.py --only);
#   RESUME_ARGS (environment): more arguments of spec_auto.py --resume (--slots 2 --physical --repeat 4);
#   CALIBRATE_ARGS (environment): more arguments of spec_auto.py --calibrate (--physical: pinned like the rooms).
set -u
KIT=$1; OUT=$2; ROOMS_S=$3
t0=$(date +%s)
say() { echo "$(date -u +%H:%M:%S) +$(( $(date +%s) - t0 ))s $*"; }
cat "$KIT"/part.0 "$KIT"/part.1 > /tmp/model.gguf
echo "$(cat "$KIT"/model.sha256)  /tmp/model.gguf" | sha256sum -c || exit 3
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$KIT"/w/*.whl || exit 2
export PYTHONPATH=/tmp/site:$PWD SPLITROOM_GGUF=/tmp/model.gguf SPLITROOM_CACHE=/tmp/cache PYTHONUNBUFFERED=1
say "cpus $(nproc); $(grep -m1 'model name' /proc/cpuinfo); $(uptime)"
say "thread siblings: $(for c in /sys/devices/system/cpu/cpu[0-9]*; do printf '%s:%s ' "${c##*cpu}" "$(cat $c/topology/thread_siblings_list 2>/dev/null)"; done)"
python3 -c "from runtime.weights import ensure_safetensors; print(ensure_safetensors())" || exit 4
say converted
python3 scripts/spec_auto.py --calibrate "$OUT"/spec-auto.profile.yaml ${CALIBRATE_ARGS:-} || exit 5
say calibrated
python3 scripts/spec_auto.py --predict-only --profile "$OUT"/spec-auto.profile.yaml --out "$OUT"/spec-auto.json \
  ${ROWS:+--only "$ROWS"} || exit 6
cp "$OUT"/spec-auto.json "$OUT"/spec-auto.predicted.json
say predicted
python3 scripts/spec_auto.py --resume "$OUT"/spec-auto.json --profile "$OUT"/spec-auto.profile.yaml \
  --budget-s "$ROOMS_S" ${RESUME_ARGS:-}
say "done; $(uptime)"
