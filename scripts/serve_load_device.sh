#!/bin/bash
# Serve under concurrent clients on a machine of many cores (docs/benchmarks.md, "each device
# process on cores of its own"): calibrate there (calibrate --quick: its pass grid, 1/5/16
# tokens at contexts 16 and 64, covers these questions' passes, and it runs the 2-device room
# but no shared-core room, so the devices are predicted as separate machines), predict every
# row, then measure with each device process pinned to cores of its own
# (scripts/serve_load.py --pin) and the round trip applied in the device processes
# (serve --in-process-delay; such a machine has no netem).
#
#   bash scripts/serve_load_device.sh CARRIED OUT BUDGET_S
#   (PY: the python, default python3; PIN: CPUs per device process, default 2, 0 for none;
#   SMOKE=1: a tiny grid, to check the steps; IN_FLIGHT, CLIENTS: the grid's N and client counts;
#   PREDICTED: a predictions file in CARRIED, from an earlier call: no calibration, no new prediction;
#   RUNS: what to measure, in order, as "RTT:N-list:clients-list[:repeats]" groups separated by
#   spaces (default "40ms:$IN_FLIGHT:$CLIENTS"), every group's rows into OUT/serve-load.json, a
#   group started only while 30 s of the budget are left; PRED_RTT, PRED_IN_FLIGHT, PRED_CLIENTS:
#   the grid predicted before any run, default the measured one's)
#
# CARRIED: a folder holding .whl/ (the wheels the machine lacks, see docs/benchmarks.md) and
# smollm2-tokenizer.gguf (scripts/make_gguf.py --tokenizer-only). The bundled model is too large
# to carry, so a random-weight checkpoint of its shape and storage (SmolLM2-135M, Q4_1, the same
# tokenizer) is made there and served in its place (SPLITROOM_GGUF): the passes cost the same,
# the answers are random tokens. OUT: where the profile, the predictions, the measurements and
# the log go. BUDGET_S: seconds from the start after which the measurement is stopped (rows
# measured so far are kept).
set -u
C=$1
OUT=$2
BUDGET_S=$3
T0=$(date +%s)
say() { echo "$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*"; }
PY=${PY:-python3}
if [ -d "$C"/.whl ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$C"/.whl/*.whl \
    || exit 1
fi
export PYTHONPATH=/tmp/site:$(pwd) PYTHONUNBUFFERED=1
export SPLITROOM_GGUF=/tmp/serve-load-random-smollm2.gguf SPLITROOM_CACHE=/tmp/serve-load-cache
say "wheels installed; $(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo)"
for c in /sys/devices/system/cpu/cpu[0-9]*; do
  printf '%s:%s ' "${c##*cpu}" "$(cat "$c"/topology/thread_siblings_list 2>/dev/null)"
done; echo
$PY scripts/make_gguf.py --shape smollm2 --mix q4_1 --tokenizer-from "$C"/smollm2-tokenizer.gguf \
  --out "$SPLITROOM_GGUF" || exit 1
sr() { $PY -c 'from splitroom.cli import main; main()' "$@"; }
S=(scenarios/home.yaml --set context=512)
G=("${S[@]}" --set "network.jitter={distribution: none}" --per-client 1 --prompt-tokens 37
   --calibration "$OUT"/profile.yaml)
IN_FLIGHT=${IN_FLIGHT:-4,1,2}
CLIENTS=${CLIENTS:-1,4,8}
if [ -n "${SMOKE:-}" ]; then  # a few seconds of the same steps, to check them
  IN_FLIGHT=2 CLIENTS=2
  G+=(--max-tokens 8)
  RUNS="40ms:2:2:1"
else
  G+=(--max-tokens 24)
fi
RUNS=${RUNS:-40ms:$IN_FLIGHT:$CLIENTS}
if [ -n "${PREDICTED:-}" ]; then  # a later call: the profile and predictions of an earlier one
  cp "$C/$PREDICTED" "$OUT"/predicted.json || exit 1
  say "predictions from $PREDICTED (made $(grep -m1 made_utc "$OUT"/predicted.json))"
else
  say "calibrating"
  sr calibrate "${S[@]}" --quick --out "$OUT"/profile.yaml > "$OUT"/calibrate.txt 2>&1 \
    || { tail -5 "$OUT"/calibrate.txt; exit 1; }
  say "calibrated"
  $PY scripts/serve_load.py "${G[@]}" --rtt "${PRED_RTT:-40ms}" --in-flight "${PRED_IN_FLIGHT:-$IN_FLIGHT}" \
    --clients "${PRED_CLIENTS:-$CLIENTS}" --predict-only --out "$OUT"/predicted.json || exit 1
  say "predicted"
fi
for RUN in $RUNS; do
  IFS=: read -r RTT NS CS REP <<< "$RUN"
  LEFT=$(( BUDGET_S - ($(date +%s) - T0) ))
  [ "$LEFT" -ge 30 ] || { say "no time left for $RUN"; break; }
  say "measuring $RUN ($LEFT s left)"
  timeout -s TERM "$LEFT" $PY scripts/serve_load.py "${G[@]}" --rtt "$RTT" --in-flight "$NS" --clients "$CS" \
    --repeats "${REP:-3}" --predictions "$OUT"/predicted.json --in-process-delay --pin "${PIN:-2}" \
    --out "$OUT"/part.json
  say "measured $RUN (exit $?)"
  [ -f "$OUT"/part.json ] && $PY - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
part = json.loads((out / "part.json").read_text())
whole = out / "serve-load.json"
if whole.exists():  # the groups' rows in one file (one file back instead of one a group)
    d = json.loads(whole.read_text())
    d["rows"] += part["rows"]
else:
    d = part
whole.write_text(json.dumps(d, indent=1))
(out / "part.json").unlink()
PYEOF
done
$PY scripts/serve_load.py --table "$OUT"/serve-load.json
