#!/bin/bash
# The GPU decode benchmark of issue 21 in one device call (docs/benchmarks.md, "NVIDIA H200"):
# the Llama-3B shape (f16, Q4_K, Q4_K_M and the kernel variants in VARIANTS_3B, side by side in
# one run), then the SmolLM2 shape (f16, Q8_0, Q4_1 and VARIANTS_SMOL, torch's f16 CUDA graph).
#
#   bash scripts/gpu_bench_device.sh CARRIED OUT BUDGET_S
#
# CARRIED: a folder holding .whl/ (wgpu 0.32.0, cffi 2.1.1, pycparser 3.12, rendercanvas 2.7.2,
# gguf 0.19.0: what the machine lacks) and .gl/ (the Vulkan loader debs, unpacked into /).
# OUT: where the JSON files and the log go. BUDGET_S: seconds from the start; the Llama-3B run
# starts no variant after BUDGET_S - 170 s (those left are listed in its JSON); the SmolLM2 run
# starts none within 50 s of BUDGET_S (its torch loop comes after them) and is stopped at BUDGET_S.
set -u
C=$1 OUT=$2 BUDGET_S=$3 T0=$(date +%s)
say() { echo "$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*"; }
for f in "$C"/.gl/*.deb; do dpkg -x "$f" /; done
ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$C"/.whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$(pwd) PYTHONUNBUFFERED=1 WGPU_BACKEND_TYPE=Vulkan
export VK_DRIVER_FILES=${ICD_FILE:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}  # ICD_FILE: a dry run elsewhere
say "set up; $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader)"
W=SPLITROOM_WGPU
# the kernel forms of docs/runtime.md's knobs beside the defaults, most wanted first (a run out of
# time drops the last): the 16-byte pieces of before 2026-12-02, the pieces with 2 rows a subgroup,
# code words with one row, Q4_K_M as before, f16 pieces with 2 rows
V3_DEFAULT=""
for v in q4_k@WORDS=0+RS=1 q4_k@WORDS=0+WIDE=2+RS=2 q4_k@RS=1 q4_k_m@WORDS=0+RS=1 f16@WIDE=f16:4+RS=2; do
  V3_DEFAULT+="${v%%@*}@$(echo "${v#*@}" | sed "s/\([A-Z_]*\)=/$W""_\1=/g");"
done
V3=${VARIANTS_3B:-$V3_DEFAULT}
VS=${VARIANTS_SMOL:-"f16@$W""_RS=2;q8_0@$W""_RS=2;q4_1@$W""_RS=2"}
say "variants: $V3"
# NUMPY_REF (default q4_k: the numpy logits Q4_K is checked against; "none" saves about 25 s),
# STOP_3B (default BUDGET_S - 170: seconds after which no Llama-3B variant starts), FORMATS_3B
# (default f16,q4_k,q4_k_m: the defaults run first) can be set; SHAPE_3B / SHAPE_SMOL (default
# llama-3b / smollm2) and BENCH_ARGS (added to both runs) are for a dry run of this script on
# lavapipe: SHAPE_3B=tiny SHAPE_SMOL=tiny BENCH_ARGS="--quick --no-torch" SPLITROOM_WGPU_FAST=1
# ICD_FILE=/usr/share/vulkan/icd.d/lvp_icd.x86_64.json (with python3, dpkg, ldconfig and pip shimmed)
python3 scripts/gpu_bench.py --shape "${SHAPE_3B:-llama-3b}" --formats "${FORMATS_3B:-f16,q4_k,q4_k_m}" --reps 3 --steps 64 --per-submit 1,4 \
  --numpy-ref "${NUMPY_REF:-q4_k}" --torch-dtypes "" --stop-after-s "${STOP_3B:-$(( BUDGET_S - 170 ))}" --variants "$V3" \
  --out "$OUT"/gpu-bench-llama3b.json ${BENCH_ARGS:-}
say "llama-3b done (rc $?)"
rm -rf /tmp/splitroom-gguf
LEFT=$(( BUDGET_S - ($(date +%s) - T0) ))
timeout $(( LEFT > 10 ? LEFT : 10 )) python3 scripts/gpu_bench.py --shape "${SHAPE_SMOL:-smollm2}" --formats f16,q8_0,q4_1 --reps 3 \
  --per-submit 1,4 --numpy-ref none --torch-dtypes f16 --stop-after-s $(( LEFT > 80 ? LEFT - 50 : 30 )) \
  --variants "$VS" --out "$OUT"/gpu-bench-smollm2.json ${BENCH_ARGS:-}
say "smollm2 done (rc $?)"
