#!/bin/bash
# GPU A/B of the framework-free rmsnorm-fp8 and swiglu-fp8 launchers: the csrc/ of a git revision
# (default main) against the working tree's, compiled with fused-llm build's device flags
# (COMMON_NVCC_FLAGS, -std=c++20, sm_80 + sm_90 + compute_90 PTX). Each harness runs the same
# deterministic cases (every dtype, quantization mode, e4m3 format, residual / gated, rows 1..2048,
# widths 7..65536) and prints a hash of every output; the two sides must print the same lines.
# rmsnorm-fp8 also prints the time of a few bf16 shapes (mean of 200 back-to-back launches,
# median of 7). Needs nvcc and a GPU of capability >= 8.0.
#   tools/gpu_ab/run.sh [REVISION]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BASE=${1:-main}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/before"
git -C "$ROOT" archive "$BASE" rmsnorm-fp8/csrc swiglu-fp8/csrc | tar -x -C "$WORK/before"
F="-O3 -DCUDA_KERNEL -DUSE_CUDA -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ -D__CUDA_NO_BFLOAT16_CONVERSIONS__
   -D__CUDA_NO_HALF2_OPERATORS__ --expt-relaxed-constexpr -std=c++20 -gencode=arch=compute_80,code=sm_80
   -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_90,code=compute_90"
H="$ROOT/tools/gpu_ab"
for side in before after; do
  dir=$([ $side = before ] && echo "$WORK/before" || echo "$ROOT")
  nvcc $F -I"$H" -I"$dir/rmsnorm-fp8/csrc" "$H/ab_rmsnorm.cu" "$dir/rmsnorm-fp8/csrc/rmsnorm_fp8_gpu.cu" -o "$WORK/rms_$side" &
  nvcc $F -I"$H" -I"$dir/swiglu-fp8/csrc" "$H/ab_swiglu.cu" "$dir/swiglu-fp8/csrc/swiglu_fp8_gpu.cu" -o "$WORK/swi_$side" &
done
wait
OUTDIR=${OUT:-$WORK}
status=0
for k in rms swi; do
  "$WORK/${k}_before" > "$OUTDIR/${k}_before.txt"
  "$WORK/${k}_after" > "$OUTDIR/${k}_after.txt"
  if diff <(grep '^case' "$OUTDIR/${k}_before.txt") <(grep '^case' "$OUTDIR/${k}_after.txt") > /dev/null; then
    echo "$k: $(grep -c '^case' "$OUTDIR/${k}_after.txt") cases, outputs identical to $BASE"
  else
    echo "$k: outputs DIFFER from $BASE"; status=1
    diff <(grep '^case' "$OUTDIR/${k}_before.txt") <(grep '^case' "$OUTDIR/${k}_after.txt") | head -20
  fi
done
echo "rmsnorm-fp8 bf16 + residual, e4m3fn: time before | after (us)"
paste <(grep '^time' "$OUTDIR/rms_before.txt") <(grep '^time' "$OUTDIR/rms_after.txt" | awk '{print $5, $6}')
exit $status
