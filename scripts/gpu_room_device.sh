#!/usr/bin/env bash
# The GPU room of issue 21 in one device call (docs/benchmarks.md, "NVIDIA H200: a room of wgpu
# stages ... 2026-12-03"): set up, make the Llama-3B-shaped Q8_0 checkpoint, calibrate (idle
# factors and the in-process delay's lateness included), write every prediction, record what
# each stage range holds against the file's bytes, then run the rooms on loopback and at 20 and
# 40 ms (round trip applied in process) until DEADLINE seconds have passed.
#
# Usage (on the device machine, in the unpacked source): bash scripts/gpu_room_device.sh KIT OUT [DEADLINE]
#   KIT: a folder with .whl (wgpu, gguf, aiortc and their needs), .gl (Vulkan loader debs) and
#        smollm2-tokenizer.gguf (scripts/make_gguf.py --tokenizer-only); OUT: where results go.
set -u -o pipefail
KIT=$1 OUT=$2 DEADLINE=${3:-470}
for f in "$KIT"/.gl/*.deb; do dpkg -x "$f" /; done
ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$KIT"/.whl/*.whl || exit 2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 WGPU_BACKEND_TYPE=Vulkan
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,clocks.sm --format=csv; nproc; uptime; } \
  > "$OUT/machine.txt" 2>&1
python3 scripts/gpu_room.py --shape llama-3b --mix q8_0 --repeat 2 --answer-tokens 64 --rtt-ms 20,40 \
  --weight-bytes --deadline-s "$DEADLINE" --tokenizer-from "$KIT/smollm2-tokenizer.gguf" \
  --gguf /tmp/llama3b-q8_0.gguf --out "$OUT/gpu-room.json" 2>&1 | tee "$OUT/gpu-room.log"
ls "$OUT"
